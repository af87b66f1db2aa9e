"""The Python API for embedding aclserve without HTTP.

    with aclserve.Engine(device="auto") as engine:
        model = engine.load("models/digits.om")
        probs = model.infer({"x": batch})["y"]           # synchronous
        probs = (await model.infer_async({"x": batch}))["y"]
        future = model.submit({"x": batch})              # concurrent.futures.Future

A request of N rows runs in the smallest compiled gear that holds it (padding is dropped);
more rows than the largest gear are split into several runs and the outputs concatenated.
Calls from many threads or tasks share the model's instances and slots; they are not merged
into one batch (the HTTP server's dynamic batcher does that). Closing the engine or a model
refuses calls from then on and lets those made before it finish first (engine_calls.OpenCalls).
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Mapping

from ..errors import Closed
from ..value_ranges import ValueRange, ValueRangeError, value_range
from .acl_runtime import AclRuntime
from .builder import open_pool
from .closing import close_pools
from .engine_model import ENGINE_CLOSED, EngineModel, deadline_after, refuse_in_callback
from .engine_options import check_options
from .engine_process import CreatedIn
from .types import TensorSpec
from .warmup import warm_up

log = logging.getLogger(__name__)


class Engine:
    """Owns an AclRuntime and the models loaded through it; closing it unloads them all, once
    the loads under way have ended, and for good (a load afterwards is refused)."""

    def __init__(self, device: str = "auto", cpu_threads: int | None = None, memory_reserve_fraction: float = 0.1):
        """device: "npu" (CANN and a device needed), "cpu" (the CPU runtime: ONNX Runtime) or "auto":
        as `aclserve serve`'s, ACLSERVE_DEVICE's npu or cpu, else the NPU when CANN sees one, else the
        CPU ("npu" or "cpu" here win; a bad variable: ValueError, npu without CANN: AclUnavailable, at
        the first load). cpu_threads: ONNX Runtime threads per model on the CPU runtime (None:
        ACLSERVE_CPU_THREADS, else 1). memory_reserve_fraction: the share of each device's memory a
        load leaves free (as the server's; from 0 to below 1). Nothing starts before the first load
        or `with`. Close it (close(), or use it in a `with` block): until then its threads and
        device state stay, an Engine dropped unclosed included, and it is closed at exit."""
        check_options(device=device, cpu_threads=cpu_threads, memory_reserve_fraction=memory_reserve_fraction)
        threads = None if cpu_threads is None else int(cpu_threads)  # (a numpy int: the CPU runtime takes int)
        self.created_in = CreatedIn()  # every call in another process (a fork's child) raises: engine_process
        self.runtime = AclRuntime(device, threads, float(memory_reserve_fraction), limits_setting=None)
        self.models: list[EngineModel] = []
        self._state = threading.Condition()  # guards _loading and _closed
        self._loading = 0
        self._runtime_left = False  # a close left the runtime to the loads under way
        self._closed = False
        # one close at a time: a second closer found no model left and closed the runtime while
        # the first still closed an instance (the device not reset, ACL not finalized, a context kept)
        self._close_lock = threading.Lock()
        _open_engines.add(self)

    def __enter__(self) -> "Engine":
        self.created_in.check()
        self._refuse_if_closed()
        self.runtime.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load(self, path: str | os.PathLike, name: str | None = None, instances: int = 1,
             devices: tuple[int, ...] = (0,), slots: int = 2, retry: bool = True, warmup: bool = True,
             warmup_data: str = "zeros", value_ranges: Mapping[str, tuple[int, int]] | None = None) -> EngineModel:
        """Load an OM (blocking) and, by default, run every gear on `warmup_data` (zeros or ones)
        to warm it up, which also sets the model's execution timeout from what a run costs
        (without it: 60 s). `name`: the model's (default: the file's name without .om).
        `instances` copies of it (each its own context, streams and `slots` sets of buffers,
        so the next run's inputs are copied while one computes) go over the device ids in
        `devices`, each on the one holding the fewest instances (builder._placed); calls share
        them. `retry`: a run the device fails runs again, on
        another instance if there is one (as the server's retry). value_ranges: {integer input
        name: (smallest, largest)}, as a model's YAML gives `value_range` (an OM carries none):
        a call holding any other value is refused with a ValueError before it runs. Ctrl-C
        while it loads closes what it opened without waiting for the device (what the device
        still runs is abandoned, as a close's timeout does)."""
        check_options(path=path, name=name, instances=instances, devices=devices, slots=slots, retry=retry,
                      warmup=warmup, warmup_data=warmup_data, value_ranges=value_ranges)
        self.created_in.check()
        with self._state:
            self._refuse_if_closed()
            self._loading += 1
        try:
            return self._load(os.fspath(path), name, int(instances), tuple(int(d) for d in devices), int(slots),
                              bool(retry), warmup_data if warmup else None, dict(value_ranges or {}))
        finally:
            with self._state:
                self._loading -= 1
                self._state.notify_all()
                last_after_close = self._runtime_left and not self._loading
                if last_after_close:
                    self._runtime_left = False
            if last_after_close:  # (a close bounded in time left the runtime to the loads: the last lets go)
                self._let_go_of_runtime()

    def _load(self, path, name, instances, devices, slots, retry, warmup_data, given_ranges) -> EngineModel:
        self.runtime.start()
        name = name or os.path.splitext(os.path.basename(path))[0]
        pool = open_pool(self.runtime, path, name, instances=instances, devices=devices, slots=slots, retry=retry)
        try:
            ranges = _ranges(given_ranges, pool.inputs)  # (checked against the model before its warm-up)
            if warmup_data is not None:  # (the remedy is said after a failure on zeros only: warm_up)
                warm_up(pool, data=warmup_data,
                        remedy=" (if the model cannot run on zeros, load it with warmup_data='ones' or warmup=False)")
                pool.set_execution_timeout(0)  # as the server: derived from the warm-up's runs
            model = EngineModel(pool, self, ranges)
        except BaseException as e:  # (a failed warm-up, Ctrl-C): its instances closed, not left running
            close_pools([pool], None, interrupted=isinstance(e, KeyboardInterrupt))
            raise
        with self._state:
            if not self._closed:
                self.models.append(model)
                return model
        close_pools([pool], None)  # (the engine closed while it loaded: a close bounded in time left it to this load)
        raise Closed(f"{ENGINE_CLOSED} (it closed while model {name} loaded)")

    def close(self, timeout: float | None = None) -> None:
        """Refuse loads and calls from now on (Closed); once the loads under way have ended and the
        calls made before have been answered (and the runs launched by those given up have ended),
        unload every model and let go of the runtime (blocking). `timeout`: at most that many
        seconds for the calls (None: until each is answered, every run bounded by its model's
        execution timeout); those still unanswered then fail with Closed, and a device still running
        one is left to itself, as the server's shutdown_timeout_s does. Ctrl-C in it fails the calls
        left with Closed at once and leaves the device as a timeout does. A close from another
        thread meanwhile waits for it. Not from a future's done-callback: that runs on the engine's
        own thread."""
        self.created_in.check()
        refuse_in_callback(self, "Engine.close()", "it runs on the engine's own thread, which close waits for")
        check_options(timeout=timeout)
        if not self._close(loads_wait_s=timeout, deadline=deadline_after(timeout)):
            log.warning("Engine.close(timeout=%g): a model load still under way; its model is left to it", timeout)

    def _close(self, loads_wait_s: float | None = None, deadline: float | None = None) -> bool:
        """close(), waiting at most `loads_wait_s` for the loads under way (None: for them all)
        and until `deadline` (time.monotonic(); None: no limit) for the calls; when the loads
        have not ended by then, the loaded models are closed all the same and the runtime is
        left to the loads: False."""
        with self._close_lock:  # (a second close returns once the first is done)
            with self._state:
                self._closed = True
                loads_ended = self._state.wait_for(lambda: self._loading == 0, loads_wait_s)
                models, self.models = self.models, []
            for model in models:  # all refuse calls before any is waited for
                model._calls.stop(ENGINE_CLOSED)
            interrupted = False
            try:
                for model in models:
                    model._drain(deadline)
            except BaseException:  # Ctrl-C in the wait: the calls left fail now, the device is not waited for
                interrupted = True
                for model in models:
                    model._fail(model._calls.still_open(), "the close was interrupted")
                raise
            finally:  # (the models are closed all the same, and the runtime let go of)
                try:
                    close_pools([model.pool for model in reversed(models)], deadline, interrupted)
                finally:
                    with self._state:  # a load still under way lets go of the runtime as it ends (load's finally)
                        self._runtime_left = bool(self._loading)
                    if not self._runtime_left:
                        self._let_go_of_runtime()
        return loads_ended

    def _let_go_of_runtime(self) -> None:
        self.runtime.close()
        _open_engines.discard(self)

    def _close_model(self, model: EngineModel, deadline: float | None) -> None:
        """EngineModel.close(): under the engine's close lock, so that an Engine.close() meanwhile
        waits for it (it returned while the model's instance still closed: the device not reset)."""
        with self._close_lock:
            with self._state:
                if model in self.models:
                    self.models.remove(model)
            model._close(deadline, f"model {model.name} is closed")

    @property
    def closed(self) -> bool:
        """close() has begun: loads are refused, calls answered with that."""
        return self._closed

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise Closed(ENGINE_CLOSED)


def _ranges(given: Mapping[str, tuple[int, int]], inputs: list[TensorSpec]) -> dict[str, ValueRange]:
    """Engine.load's value_ranges checked against the model, as the server checks a YAML's."""
    ranges = {}
    for name, (low, high) in given.items():
        try:
            ranges[name] = value_range(name, int(low), int(high), inputs, "value_ranges given to Engine.load")
        except ValueRangeError as e:
            raise ValueRangeError(f"value_ranges[{name!r}]: {e}") from None
    return ranges


# Engines not closed when the interpreter exits: closed then, the calls made before finishing
# first (said in a WARNING line), for at most EXIT_DRAIN_S (the server's default
# shutdown_timeout_s: a hung device does not hold the exit). Without it a run of ONNX Runtime
# still going in a daemon thread met the interpreter's end, and the process died of SIGABRT
# ("terminate called without an active exception"). One still loading a model after
# EXIT_LOAD_WAIT_S has its loaded models closed and its runtime left to the load (a hung load
# held the exit).
_open_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()
EXIT_LOAD_WAIT_S = 10.0
EXIT_DRAIN_S = 30.0


@atexit.register
def _close_open_engines() -> None:
    drained_by = time.monotonic() + EXIT_DRAIN_S  # (one bound for them all)
    for engine in [e for e in _open_engines if e.created_in.here()]:  # (a forked child's exit: not its own)
        try:
            _say_what_the_exit_waits_for(engine, drained_by)
            if not engine._close(EXIT_LOAD_WAIT_S, drained_by):
                log.warning("an Engine still loading a model %.0f s into the exit: its loaded models are closed, "
                            "its runtime is not", EXIT_LOAD_WAIT_S)
        except Exception:  # (the others still close)
            log.exception("closing an Engine left open at exit failed")


def _say_what_the_exit_waits_for(engine: Engine, drained_by: float) -> None:
    """A WARNING line per model whose calls the exit waits for: it said nothing, and a program
    whose call was interrupted (Ctrl-C) seemed to hang at its exit (tester t46)."""
    for model in list(engine.models):
        unanswered, runs = model._calls.awaited()
        if unanswered or runs:
            log.warning("exit: an Engine left open is closed; model %s: waiting at most %.0f s for %d call(s) not "
                        "answered yet and %d run(s) handed to the device (launched or queued) by calls answered "
                        "or given up (cancelled, past infer()'s timeout, interrupted: their runs not handed on are "
                        "dropped)", model.name,
                        max(0.0, drained_by - time.monotonic()), unanswered, runs)
