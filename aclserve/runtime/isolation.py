"""A failed batch of several requests re-run one request per run (InstancePool, with `retry`).

The device cannot say which request made a batch fault: one whose data the model cannot run
(token ids past an embedding's rows, indices out of a gather's range) fails the batch it shares
with others. So a batch of several requests that fails (not a timeout) is split into parts, one
request each, run one at a time on any instance that can take them (the failed one once rebuilt
or reset); a part that fails is not run again. Their outcomes are gathered back into the batch,
which goes to the pool's listener once, as any batch does: its `errors` holds each request's own
failure when some of its requests failed and others did not; when all failed, `error` is the
first one.
"""
from __future__ import annotations

import bisect
import collections
import threading

from .batch import Batch


class _Gathering:
    """The outcomes of a split batch's parts, until the last one is in."""

    def __init__(self, whole: Batch):
        self.whole = whole
        self.outputs: list = [None] * len(whole.inputs)
        self.errors: list[BaseException | None] = [None] * len(whole.inputs)
        self.left = len(whole.inputs)
        self.lock = threading.Lock()  # (a closing pool answers waiting parts while one runs)

    def done(self, index: int, part: Batch) -> Batch | None:
        """Part `index` finished: the whole batch once it is the last, with each request's outcome."""
        with self.lock:
            if part.error is None:
                self.outputs[index] = part.outputs[0]
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
            whole.instance = part.instance
        return whole


class Part:
    """A part's `requests`: where its outcome goes (the pool's own record, not a submitter's)."""

    __slots__ = ("gathering", "index")

    def __init__(self, gathering: _Gathering, index: int):
        self.gathering = gathering
        self.index = index


class Isolation:
    """A pool's parts, run one at a time: where the streams stop on a failure, a failure fails
    every batch in flight on that context, so a part run beside another could fail it too."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: collections.deque[Batch] = collections.deque()
        self._running: Batch | None = None

    def add(self, batch: Batch, gears: tuple[int, ...]) -> tuple[Batch, ...]:
        """Split failed `batch` into parts; returns what to run now (to_run)."""
        parts = split(batch, gears)
        with self._lock:
            self._waiting.extend(parts)
        return self.to_run()

    def to_run(self) -> tuple[Batch, ...]:
        """The part to run now, if none runs and one waits (the caller dispatches it)."""
        with self._lock:
            if self._running is not None or not self._waiting:
                return ()
            self._running = self._waiting.popleft()
            return (self._running,)

    def drain(self) -> list[Batch]:
        """The parts still waiting (a pool closing answers them)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        return waiting

    def finished(self, batch: Batch) -> Batch | None:
        """What the pool's listener gets for finished `batch`: itself, unless it is a part; for a
        part, its whole once every part is done (None before)."""
        part = batch.requests
        if type(part) is not Part:
            return batch
        with self._lock:
            if self._running is batch:
                self._running = None
        return part.gathering.done(part.index, batch)


def split(batch: Batch, gears: tuple[int, ...]) -> list[Batch]:
    """One part per request of the failed `batch` (of a model with gears: a static model runs
    one request per batch), each in the smallest gear that holds it, marked as a re-run of the
    lane it failed on (run once more at most; counted as retried)."""
    gathering = _Gathering(batch)
    parts = []
    for index, inputs in enumerate(batch.inputs):
        rows = len(next(iter(inputs.values())))  # every input of a gear model has the batch first
        part = Batch([inputs], gears[bisect.bisect_left(gears, rows)], rows, requests=Part(gathering, index),
                     dispatched_ns=batch.dispatched_ns)
        part.failed_lane = batch.ran_on  # (failed_by stays None: the failed instance may run it once healthy)
        parts.append(part)
    return parts
