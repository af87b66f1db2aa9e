"""A failed batch re-run one request per run, each run alone (InstancePool, with `retry`).

The device cannot say which request made a batch fault: one whose data the model cannot run
(token ids past an embedding's rows, indices out of a gather's range) fails the batch it shares
with others, and a stopped context fails every batch in flight with it. So a batch that fails
on the device (not a timeout) holding several requests, or with other batches in flight on its
instance (`Batch.beside`), is split into parts, one request each, run one at a time, each alone
on one instance (`Isolation.lane`: the one the first such batch failed on, once rebuilt or reset,
or a healthy one once that rebuild fails: pool.py), which runs nothing else meanwhile while the
model's other instances serve on: a part then fails for its own request only, and is not run
again. Their outcomes are gathered back into the batch, which goes
to the pool's listener once, as any batch does: its `errors` holds each request's own failure
when some of its requests failed and others did not; when all failed, `error` is the first one.
Its `runs` are the parts that succeeded, each a run of its own for the statistics (its gear,
rows, device timings, its launch on an instance (its launcher's stamp, Batch.launched_ns: where its
request's queue time ends) and its wall time from then to its result).
"""
from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Callable

from ..trace.records import rerun
from . import device_health
from .batch import Batch, Run


class _Gathering:
    """The outcomes of a split batch's parts, until the last one is in."""

    def __init__(self, whole: Batch):
        self.whole = whole
        self.outputs: list = [None] * len(whole.inputs)
        self.errors: list[BaseException | None] = [None] * len(whole.inputs)
        self.runs: list[Run] = []
        self.left = len(whole.inputs)
        self.lock = threading.Lock()  # (a closing pool answers waiting parts while one runs)

    def done(self, index: int, part: Batch, now_ns: int) -> Batch | None:
        """Part `index` finished, its result in at `now_ns` (time.perf_counter_ns): the whole batch
        once it is the last, with each request's outcome and the runs that succeeded."""
        with self.lock:
            if part.error is None:
                self.outputs[index] = part.outputs[0]
                self.runs.append(Run(index, part.gear, part.rows, part.timings, now_ns - part.launched_ns,
                                     part.instance, part.launched_ns))
            else:
                self.errors[index] = part.error
            self.left -= 1
            if self.left:
                return None
        whole, errors = self.whole, self.errors
        if all(error is not None for error in errors):
            whole.error, whole.outputs = errors[0], None
        else:
            whole.error, whole.outputs = None, self.outputs
            whole.errors = errors if any(error is not None for error in errors) else None
            whole.instance, whole.runs = part.instance, self.runs
        return whole


class Part:
    """A part's `requests`: where its outcome goes (the pool's own record, not a submitter's)."""

    __slots__ = ("gathering", "index")

    def __init__(self, gathering: _Gathering, index: int):
        self.gathering = gathering
        self.index = index


class Isolation:
    """A pool's parts, run one at a time, each alone on one instance, `lane` (the pool chooses it),
    which takes nothing else while any part is left (`active`); the other instances serve on.
    Where the streams stop on a failure, a failure fails every batch in flight on that context,
    so a part run beside another batch could fail for it, and its request would not run again."""

    def __init__(self, dispatch: Callable[[Batch], None]):
        self._dispatch = dispatch  # the pool's: launches a part, keeps it waiting, or answers it
        self._lock = threading.Lock()
        self._waiting: collections.deque[Batch] = collections.deque()
        self._running: Batch | None = None
        self._left = 0  # parts not finished yet (one int: read without the lock)
        self.lane = 0  # the instance the parts run on, while `active`
        self._on_stack = threading.local()  # a dispatch answering a part at once: the loop above runs the next

    @property
    def active(self) -> bool:
        return self._left > 0

    def add(self, batch: Batch, gears: tuple[int, ...]) -> None:
        """Split failed `batch` into parts and run the first (if none runs)."""
        parts = split(batch, gears)
        with self._lock:
            if not self._left:
                self.lane = batch.ran_on or 0
            self._waiting.extend(parts)
            self._left += len(parts)
        self._run_next()

    def reserve(self, instances: list, backing_off: set[int]) -> tuple[int, object] | None:
        """A part's (lane, slot) on `lane`, alone there (the pool's lock held). Its rebuild backing off,
        or its device found failed as a whole, `lane` moves to a healthy instance if there is one; a
        lane on a failed device takes nothing (the pool answers the part: device_health.py)."""
        if self.lane in backing_off or device_health.on_failed_device(instances[self.lane]):
            self.lane = next((k for k, instance in enumerate(instances) if not instance.broken
                              and not device_health.on_failed_device(instance)), self.lane)
        instance = instances[self.lane]
        slot = None if device_health.on_failed_device(instance) else instance.try_reserve(alone=True)
        return (self.lane, slot) if slot is not None else None

    def finished(self, batch: Batch) -> Batch | None:
        """What the pool's listener gets for finished `batch`: itself, unless it is a part; for a
        part, its whole once every part is done (None before). The next part runs."""
        if not is_part(batch):
            return batch
        part = batch.requests
        with self._lock:
            if self._running is batch:
                self._running = None
            self._left -= 1
        whole = part.gathering.done(part.index, batch, time.perf_counter_ns())
        self._run_next()
        return whole

    def drain(self) -> list[Batch]:
        """The parts still waiting (a pool closing answers them)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        return waiting

    def _run_next(self) -> None:
        if getattr(self._on_stack, "running", False):
            return
        self._on_stack.running = True
        try:
            while True:
                with self._lock:
                    if self._running is not None or not self._waiting:
                        return
                    part = self._running = self._waiting.popleft()
                self._dispatch(part)
        finally:
            self._on_stack.running = False


def is_part(batch: Batch) -> bool:
    return type(batch.requests) is Part


def split(batch: Batch, gears: tuple[int, ...]) -> list[Batch]:
    """One part per request of the failed `batch` (a static model's holds one), each in the
    smallest gear that holds it, marked as a re-run of the lane it failed on (not run again if it
    fails; counted as retried); a sampled request's part is traced as a batch of its own."""
    gathering = _Gathering(batch)
    parts = []
    for index, inputs in enumerate(batch.inputs):
        rows = len(next(iter(inputs.values()))) if gears else batch.rows  # (a gear model's inputs: batch first)
        gear = gears[bisect.bisect_left(gears, rows)] if gears else None
        trace = rerun(batch.trace, index, gear, rows) if batch.trace is not None else None
        part = Batch([inputs], gear, rows, trace=trace, requests=Part(gathering, index),
                     dispatched_ns=batch.dispatched_ns)
        part.failed_lane = batch.ran_on  # (failed_by stays None: the failed instance may run it once healthy)
        part.error = batch.error  # kept if it never runs (no instance can), as a retry keeps its first
        parts.append(part)
    return parts
