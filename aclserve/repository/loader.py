"""Build one ServedVersion from a model file: compile (.onnx), validate, open the pool, warm up.

Every blocking step runs in the repository's executor; `limit` (the repository's semaphore,
load_concurrency) bounds how many versions load at once so other models' latency is not hurt.
Nothing is unloaded here: the caller swaps the result in. On failure everything this built is
closed before the error propagates. Cancellation cannot stop a step already in a thread; the
step finishes and its resources are released.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from ..images import ImageStage
from ..scheduling import DynamicBatcher
from . import cache_dir, overload
from .labels import load_labels
from .plan import Wanted
from .served import ServedVersion
from .validate import validate_om

log = logging.getLogger(__name__)


async def load_version(runtime, executor, limit: asyncio.Semaphore, name: str, version: str,
                       wanted: Wanted, compile_cache_dir: str, models_dir: str) -> ServedVersion:
    loop = asyncio.get_running_loop()
    run = functools.partial(loop.run_in_executor, executor)
    config = wanted.config
    async with limit:
        start = time.monotonic()
        om_path = wanted.file.path
        if wanted.file.kind == "onnx":
            from .compiler import compiled_om
            soc = runtime.soc_name() if runtime.kind == "npu" else None
            cache = await run(cache_dir.resolve, compile_cache_dir, models_dir)
            om_path = str(await run(functools.partial(
                compiled_om, om_path, name, config.compile, runtime.kind, cache, soc)))
        await run(validate_om, om_path, runtime.kind)
        pool = await run(functools.partial(
            _open_pool, runtime, om_path, name=f"{name}:{version}", instances=config.instances,
            devices=config.devices, slots=config.slots, retry=config.retry))
        try:
            images = ImageStage.for_model(config.inputs, pool.inputs)  # plans checked against the model
            labels = await run(load_labels, config.outputs, pool.outputs)
            await run(pool.warmup)  # three runs per gear; times the gear costs the batcher plans with
            pool.set_execution_timeout(config.execution_timeout_ms)
            config = overload.resolve(config, pool.gears, pool.gear_cost, len(pool.instances))
            batcher = DynamicBatcher(pool, config.batching, name=f"{name}:{version}")
            batcher.start()
        except BaseException:
            await run(pool.close)
            raise
        seconds = time.monotonic() - start
    log.info("%s: version %s ready (%.2f s) from %s", name, version, seconds, wanted.file.path)
    return ServedVersion(name, version, pool, batcher, config, wanted.file.path, om_path, seconds, wanted,
                         images=images, labels=labels)


def _open_pool(runtime, path, **kwargs):
    from ..runtime import open_pool  # the runtime imports ACL; keep this module light to import
    return open_pool(runtime, path, **kwargs)
