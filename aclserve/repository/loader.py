"""Build one ServedVersion from a model file: compile (.onnx), validate, then open and warm up.

Every blocking step runs in the given executor; `limit` (load_concurrency) bounds how many
versions load at once so the serving models' latency is not hurt. Nothing is unloaded here:
the caller swaps the result in. On failure everything this built is closed before the error
propagates.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from .compile_cache import CompileCache
from .plan import Wanted
from .served import ServedVersion, open_version
from .validate import validate_om

log = logging.getLogger(__name__)


async def load_version(runtime, executor, limit: asyncio.Semaphore, cache: CompileCache, name: str,
                       version: str, wanted: Wanted) -> ServedVersion:
    run = functools.partial(asyncio.get_running_loop().run_in_executor, executor)
    async with limit:
        started = time.monotonic()
        om_path = wanted.file.path
        if wanted.file.kind == "onnx":
            soc = runtime.soc_name() if runtime.kind == "npu" else None
            om_path = await run(functools.partial(
                cache.compiled, om_path, name, wanted.config.compile, runtime.kind, soc))
        await run(validate_om, om_path, runtime.kind)
        served = await open_version(executor, runtime, name, version, om_path, wanted, started)
    log.info("%s: version %s ready (%.2f s) from %s", name, version, served.load_seconds, wanted.file.path)
    return served
