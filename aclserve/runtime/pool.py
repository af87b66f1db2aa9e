"""The instances of one model version behind one BatchExecutor, and open_pool() to build them.

The pool hands each batch to the instance the batcher names (its "lane"), else to the one with
the most free slots; when none can take it the batch waits in a FIFO inside the pool (the
batcher avoids that by watching lanes()). A batch that fails on the device is re-run once on
another instance when `retry` is on.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import ExecutionFailed
from .instance import Job, ModelInstance
from .limits import Need
from .types import TensorSpec

log = logging.getLogger(__name__)


class InstancePool:
    """Owns its ModelInstances; close() closes them (blocking). Implements BatchExecutor."""

    def __init__(self, name: str, instances: list[ModelInstance], retry: bool = True):
        if not instances:
            raise ValueError("a pool needs at least one instance")
        self.name = name
        self.instances = instances
        self.retry = retry and len(instances) > 1
        model = instances[0].model
        self.inputs: list[TensorSpec] = list(model.inputs)
        self.outputs: list[TensorSpec] = list(model.outputs)
        self.gears: tuple[int, ...] = model.gears
        self.max_batch_size = self.gears[-1] if self.gears else 0
        self.gear_cost: dict[int, float] = {}
        self.compute_cost: dict[int, float] = {}
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()
        self._listeners: list[Callable[[], None]] = []
        self._closed = False
        self._close_callbacks: list[Callable[[], None]] = []
        self._busy_mark = (time.monotonic(), 0.0)
        self.batches_failed = 0  # device failures of a batch run (each retry counted again)
        self.batches_retried = 0  # ... of which were run again on another instance
        for instance in instances:
            instance._on_slot_free = self._slot_freed

    # -- BatchExecutor -------------------------------------------------------------------------
    def lanes(self) -> list[int]:
        with self._lock:
            free = [i.free_count() for i in self.instances]
            for attempt in self._pending:
                if attempt.lane is not None:
                    free[attempt.lane] -= 1
        return [max(n, 0) for n in free]

    def add_slot_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def submit(self, requests: Sequence[Mapping[str, np.ndarray]], gear: int | None,
               trace=None, lane: int | None = None) -> concurrent.futures.Future:
        rows = sum(len(next(iter(r.values()))) for r in requests) if gear is not None else 1
        if gear is not None and (gear not in self.gears or rows > gear):
            raise ValueError(f"cannot run {rows} rows in gear {gear}; compiled gears are {list(self.gears)}")
        outer: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            outer.set_exception(ExecutionFailed(f"model {self.name} is closed"))
            return outer
        if lane is not None and not 0 <= lane < len(self.instances):
            raise ValueError(f"lane {lane} is not an instance of {self.name}")
        self._dispatch(_Attempt(requests, gear, rows, outer, trace, lane))
        return outer

    # -- dispatch, retry -----------------------------------------------------------------------
    def _dispatch(self, attempt: "_Attempt") -> None:
        with self._lock:
            target = self._pick(attempt)
            if target is None:
                if not any(self._usable(i, attempt.exclude) for i in self.instances):
                    target = False
                else:
                    self._pending.append(attempt)
                    return
        if target is False:
            attempt.outer.set_exception(attempt.error or ExecutionFailed(
                f"model {self.name}: no healthy instance can run the batch"))
            return
        self._launch(attempt, *target)

    def _launch(self, attempt: "_Attempt", instance: ModelInstance, slot) -> None:
        job = Job(attempt.requests, attempt.gear, attempt.rows, trace=attempt.trace)
        job.future.add_done_callback(lambda f: self._job_done(f, attempt, instance))
        instance.launch(slot, job)

    @staticmethod
    def _usable(instance: ModelInstance, exclude) -> bool:
        return instance is not exclude and not instance.broken

    def _pick(self, attempt: "_Attempt"):
        """A reserved (instance, slot) for `attempt`, or None. A named lane is kept while that
        instance is healthy: the batch then waits for its slot rather than run elsewhere."""
        exclude = attempt.exclude
        if attempt.lane is not None:
            wanted = self.instances[attempt.lane]
            if self._usable(wanted, exclude):
                slot = wanted.try_reserve()
                return (wanted, slot) if slot is not None else None
        best, best_free = None, 0
        for instance in self.instances:
            if instance is exclude:
                continue
            free = instance.free_count()
            if free > best_free:
                best, best_free = instance, free
        if best is None:
            return None
        slot = best.try_reserve()
        return (best, slot) if slot is not None else None

    def _job_done(self, future: concurrent.futures.Future, attempt: "_Attempt", instance: ModelInstance) -> None:
        error = future.exception()
        if error is None:
            attempt.outer.set_result(future.result())
            return
        retry = self.retry and attempt.exclude is None and not self._closed
        with self._lock:  # completion threads of several instances may fail at once
            self.batches_failed += 1
            self.batches_retried += retry
        if retry:
            log.warning("%s: retrying a failed batch on another instance", self.name)
            attempt.exclude, attempt.error, attempt.lane = instance, error, None
            self._dispatch(attempt)
            return
        attempt.outer.set_exception(error)

    def _slot_freed(self, instance: ModelInstance) -> None:
        ready = []
        with self._lock:  # in FIFO order, each waiting batch that can now have a slot
            waiting, self._pending = self._pending, collections.deque()
            for attempt in waiting:
                target = self._pick(attempt)
                if target is None:
                    self._pending.append(attempt)
                else:
                    ready.append((attempt, target))
        for attempt, target in ready:
            self._launch(attempt, *target)
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("%s: slot listener failed", self.name)

    # -- warm-up, figures, teardown ----------------------------------------------------------
    def warmup(self, runs: int = 3) -> dict[int, float]:
        """Run every gear `runs` times on zeros (blocking). The cost of a gear is the quickest
        submit-to-result time of the runs after the first: what the batcher trades padding
        against, including the fixed host cost of a run, not only the device's. The quickest
        device compute time of those runs goes to `compute_cost` (when the device reports it)."""
        for gear in self.gears or (None,):
            rows = gear or 1
            request = {s.name: np.zeros((rows,) + s.sample_shape if s.batched else s.shape, s.dtype)
                       for s in self.inputs}
            best = compute = float("inf")
            for run in range(runs):
                start = time.perf_counter()
                result = self.submit([request], gear).result()
                if run:
                    best = min(best, time.perf_counter() - start)
                    if result.timings.compute_ms > 0:
                        compute = min(compute, result.timings.compute_ms / 1000.0)
            if gear is not None:
                self.gear_cost[gear] = best if best < float("inf") else 1e-6
                if compute < float("inf"):
                    self.compute_cost[gear] = compute
        return dict(self.gear_cost)

    def busy_ratio(self) -> float:
        """Fraction of wall time, since the previous call, during which instances had work in flight
        (averaged over instances)."""
        now = time.monotonic()
        busy = sum(i.busy_seconds() for i in self.instances) / len(self.instances)
        then, busy_then = self._busy_mark
        self._busy_mark = (now, busy)
        return 0.0 if now <= then else min(1.0, max(0.0, (busy - busy_then) / (now - then)))

    def utilisation(self) -> list[dict]:
        """Per instance: the fraction of the last BusyWindow seconds its compute stream executed
        (device times from events). Non-blocking."""
        return [{"instance": i.name, "device": i.device.id, "compute_busy": round(i.compute_busy.fraction(), 4)}
                for i in self.instances]

    def close(self) -> None:
        """Blocking: wait for in-flight batches, then close every instance. Safe twice."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for attempt in pending:
            attempt.outer.set_exception(ExecutionFailed(f"model {self.name} was unloaded"))
        errors = []
        for close in [i.close for i in reversed(self.instances)] + self._close_callbacks:
            try:
                close()
            except Exception as e:  # keep closing the others; report at the end
                errors.append(e)
        if errors:
            raise errors[0]

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` at the end of close(), after the instances are closed."""
        self._close_callbacks.append(callback)


class _Attempt:
    __slots__ = ("requests", "gear", "rows", "outer", "trace", "lane", "exclude", "error")

    def __init__(self, requests, gear, rows, outer, trace=None, lane=None):
        self.requests, self.gear, self.rows, self.outer = requests, gear, rows, outer
        self.trace, self.lane = trace, lane
        self.exclude: ModelInstance | None = None
        self.error: BaseException | None = None


def open_pool(runtime, path: str, name: str, instances: int = 1, devices: Sequence[int] = (0,),
              slots: int = 2, retry: bool = True, sync_timeout_ms: int = 60_000) -> InstancePool:
    """Load `instances` copies of the OM round-robin over `devices` (blocking; run off the loop).

    The streams and events the instances need are claimed on each device first, so a
    configuration the device cannot hold is refused (ResourceLimitError) before anything loads."""
    if instances < 1:
        raise ValueError("instances must be >= 1")
    if not devices:
        raise ValueError("devices must name at least one device")
    placed = [runtime.device(devices[k % len(devices)]) for k in range(instances)]
    built: list[ModelInstance] = []
    with contextlib.ExitStack() as undo:
        for device in {d.id: d for d in placed}.values():
            count = sum(1 for d in placed if d is device)
            need = Need.of(count, slots)
            device.ledger.claim(need, f"model {name} ({count} instance(s) x {slots} slots)")
            undo.callback(device.ledger.release, need)
        for k, device in enumerate(placed):
            instance = ModelInstance(runtime.acl, device, path, f"{name}#{k}", slots=slots,
                                     sync_timeout_ms=sync_timeout_ms)
            undo.callback(instance.close)
            built.append(instance)
        _check_same_model(built)
        pool = InstancePool(name, built, retry=retry)
        pool.on_close(undo.pop_all().close)  # closes the instances, then gives the claims back
    return pool


def _check_same_model(instances: list[ModelInstance]) -> None:
    first = instances[0].model
    for other in instances[1:]:
        if other.model.inputs != first.inputs or other.model.gears != first.gears:
            raise RuntimeError("instances of one pool loaded different models")
