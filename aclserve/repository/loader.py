"""Build one ServedVersion from a model file: compile (.onnx), validate, then open and warm up.
An .onnx is first checked against what its open would refuse from its config alone (room_for).

Every blocking step runs in the given executor (the compile itself in a child process);
`limit` (load_concurrency) bounds how many versions load at once, compiles included, so the
serving models' latency is not hurt. Nothing is unloaded here: the caller swaps the result in.
On failure everything this built is closed before the error propagates. `progress(step)` (on
the loop) hears each step as it begins: waiting for a turn, looking for an .onnx's compile in the
cache, compiling, checking the file, opening, each warm-up run, for the repository index to show
(a version's first, `first_step`, is its reason from the moment it is LOADING: it had none).

Servers sharing a compile cache each remove the entry of a version they retire (compile_cache
.release), and another may have just found that entry for a file put back (a rollback): an
entry gone between the hit and the open is a miss, compiled again once, not a failed file.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from typing import Callable

from ..config import PBTXT
from ..om.compile_error import CompileError
from ..om.compile_process import CompileStop
from .compile_cache import CompileCache
from .compiler import no_batch_dimension
from .load_turn import Turns, load_turn
from .pbtxt_refusals import in_pbtxt_words
from .plan import Wanted
from .running_compiles import stopped_step
from .served import ServedVersion, StoppedBeforeWarmUp, devices_refusal, open_version, pool_shape
from .status import SHUTTING_DOWN
from .validate import validate_om

log = logging.getLogger(__name__)


class RefusedByScan(ValueError):
    """A version's file the scan found not to be served (VersionFile.refused says why)."""


def first_step(wanted: Wanted) -> str:
    """The step a load of `wanted` begins with, once its turn has come (hashing a large .onnx,
    checking a large .om: seconds)."""
    file = os.path.basename(wanted.file.path)
    return f"looking for the compile of {file} in the compile cache" if wanted.file.kind == "onnx" else \
        f"checking {file}"


def declared_dims(wanted: Wanted) -> dict | None:
    """The input dims a config.pbtxt declares, each its reshape when given (the shape the model
    takes), which size the dimensions an .onnx leaves variable (om/declared_dims.py): a row's, so
    those holding the batch dimension (max_batch_size 0, both lists given) without their first; None
    when it lists no input."""
    declared = wanted.config.declared
    if declared is None or not declared.inputs:
        return None
    return {t.name: list(t.dims if t.reshape is None else t.reshape)[1 if t.with_batch else 0:]
            for t in declared.inputs}


def batch_from_defaults(wanted: Wanted) -> bool:
    """Whether an .onnx's batch sizes (compile.batch) are model_defaults', meant for every model, which
    one without a batch dimension compiles without (said at its load: batch_passed_over), not its own
    config's (refused for such a model: NoBatchDimension). A config built in code names no origin: its own.
    A config.pbtxt's own max_batch_size over 0 makes them its own: it asks for a batch dimension, which
    the compile refuses at its start, before it builds the model (_in_pbtxt_words)."""
    config, path = wanted.config, wanted.config_path()
    if wanted.file.kind != "onnx" or not config.compile.batch:
        return False
    if os.path.basename(path or "") == PBTXT and config.batching.batch_cap and "max_batch_size" in \
            config.batching.own_keys:
        return False
    return path is None or config.origin_of is not None and config.origin_of("compile.batch") != path


def batch_passed_over(batch, pool) -> bool:
    """Whether the open `pool`, compiled with model_defaults' sizes `batch`, compiled without them: no
    batch sizes, and not one size that fixes each input's first dimension (om/spec.py's resolve)."""
    return not pool.gears and not (len(batch) == 1 and all(tuple(t.shape[:1]) == (batch[0],) for t in pool.inputs))


def own_sizes_passed_over(wanted: Wanted, pool) -> bool:
    """Whether the open `pool` of an .onnx whose batch sizes are its own config's compiled without them:
    the cache's entry of a model without a batch dimension compiled under model_defaults' sizes (its
    key names no origin of the sizes: compiler.cache_key), which a compile with its own refuses."""
    batch = wanted.config.compile.batch
    return (wanted.file.kind == "onnx" and bool(batch) and not batch_from_defaults(wanted)
            and batch_passed_over(batch, pool))


def room_for(runtime, label: str, wanted: Wanted, model: str) -> None:
    """Blocking, before an .onnx's compile: what the version's open would refuse from its config
    alone (runtime/builder.check_room: instances, devices and slots, not the compiled model),
    in the open's words: a device the host has not, or devices that cannot give its instances
    their streams and events, even once what is on its way back there is back (a 57th model of 1
    instance x 2 slots on a 310's 1023 events was refused after minutes of compile and GBs of
    memory). One that fits only once those are back is compiled, said in an INFO line: its open's
    claim decides (it may not fit then either, or fit after an unload begun meanwhile)."""
    from ..runtime.builder import NoSuchDevice, check_room  # (the runtime imports ACL: keep this module light)
    try:
        fits = check_room(runtime, label, **pool_shape(wanted.config, runtime.kind), owner=model)
    except NoSuchDevice as error:
        raise devices_refusal(error, wanted.config) from None
    if not fits:
        log.info("%s: its devices have the streams and events it needs only once what closes there gives theirs back "
                 "(versions unloading or replaced, instances closing): compiled all the same, its open's count "
                 "decides", label)


async def load_version(runtime, executor, limit: Turns, cache: CompileCache, name: str,
                       version: str, wanted: Wanted, progress: Callable[[str], None] = lambda step: None,
                       stop: CompileStop | None = None, stopped: Callable[[], bool] | None = None) -> ServedVersion:
    """`stop` ends the compile of an .onnx (its child process), or the wait for a turn (any
    file's): CompileStopped. Cancelling the load stops it too: its thread would wait for the
    compile to the end. Once the compile has ended (an .om: its turn come) the load looks whether
    it is `stopped()` (default: `stop`'s word; the lifecycle's also stops it then, in poll mode, when
    its file went or was replaced since the scan), and once it is open whether `stop` came meanwhile:
    either ends it before it warms up, StoppedBeforeWarmUp (it warmed up, said "ready" and was then
    dropped). A file the scan refused (VersionFile.refused) fails at once: RefusedByScan."""
    if wanted.file.refused:  # (that version's failed load, counted and shown as any)
        raise RefusedByScan(wanted.file.refused)
    loop = asyncio.get_running_loop()
    stop = stop or CompileStop()
    stopped = stopped or (lambda: stop.stopped)
    run = functools.partial(loop.run_in_executor, executor)

    def from_thread(step: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: a load abandoned at exit, nobody to tell
            loop.call_soon_threadsafe(progress, step)

    async def om_path() -> str:
        if wanted.file.kind != "onnx":
            return wanted.file.path
        await run(room_for, runtime, f"{name}:{version}", wanted, name)  # (a refusal known now costs no compile)
        soc = runtime.soc_name() if runtime.kind == "npu" else None
        try:
            compiled = await run(functools.partial(cache.compiled, wanted.file.path, name, wanted.config.compile,
                                                   runtime.kind, soc, from_thread, stop, declared_dims(wanted),
                                                   batch_from_defaults(wanted)))
        except CompileError as e:
            refusal = in_pbtxt_words(e, wanted)
            if refusal is None:
                raise
            raise refusal from None
        except asyncio.CancelledError:  # the repository closing (a load's only canceller)
            stop.stop()
            # as lifecycle.py says an unload's stop (the shutdown's said nothing)
            log.info("%s: the %s of version %s was stopped (%s)", name, stopped_step(stop)[0], version, SHUTTING_DOWN)
            raise
        stop.compiled()  # (a stop or failure from here on ends no compile: stopped_step)
        return compiled

    async def open_om(path: str) -> ServedVersion:
        if stopped():
            raise StoppedBeforeWarmUp(path)
        if path != wanted.file.path:  # (a model's own .om: its first step says so)
            progress(f"checking the compile of {os.path.basename(wanted.file.path)}")
        await run(validate_om, path, runtime.kind)
        # what the compile of an .onnx read from it: the inputs indexing a table
        bounds = await run(cache.index_bounds, wanted.file.path, path) if wanted.file.kind == "onnx" else {}
        return await open_version(executor, runtime, name, version, path, wanted, started, from_thread, bounds,
                                  lambda: stop.stopped)  # (in its thread: the stop's word alone)

    if limit.locked():
        progress(f"waiting: other versions are loading ({limit.why})")
    async with load_turn(limit, stop):  # (a stop ends the wait for it: TurnWaitStopped)
        progress(first_step(wanted))  # (after "waiting", if it waited)
        started = time.monotonic()
        path = await om_path()
        try:
            served = await open_om(path)
        except StoppedBeforeWarmUp:
            raise
        except Exception:
            if path == wanted.file.path or os.path.exists(path):
                raise
            log.warning("%s: the compile cache entry %s was removed while version %s loaded (a server sharing "
                        "the cache retired it); compiling again", name, os.path.basename(path), version)
            served = await open_om(await om_path())
    if own_sizes_passed_over(wanted, served.pool):  # (a cache hit skipped the compile's refusal: said as it says it)
        await served.close(0.0, executor)
        refusal = no_batch_dimension()
        raise in_pbtxt_words(refusal, wanted) or refusal
    if batch_from_defaults(wanted) and batch_passed_over(wanted.config.compile.batch, served.pool):
        log.info("%s:%s: model_defaults' compile.batch %s passed over: the model has no batch dimension (no input "
                 "has a dynamic first dimension), so it compiled without batch sizes", name, version,
                 list(wanted.config.compile.batch))
    log.info("%s: version %s ready (%.2f s) from %s", name, version, served.load_seconds, wanted.file.path)
    return served
