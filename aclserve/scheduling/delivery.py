"""Answering requests: a batch's outcome to each of its requests, exactly once, in arrival
order when preserve_ordering asks for it, with the statistics recorded on the way."""
from __future__ import annotations

import asyncio
import collections
import logging

from ..errors import ExecutionFailed, ServeError
from ..runtime.batch import Batch
from .request import InferenceResult, QueuedRequest
from .stats import FAILED, BatcherStats

log = logging.getLogger(__name__)


def resolve(future: asyncio.Future, outcome) -> None:
    """Set a result or an exception, unless the future is already done (answered, cancelled)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def started(batch: Batch, launched_ns: int | None = None) -> int:
    """When `batch` (or its run launched at `launched_ns`) started: its (last) launch on an instance,
    stamped by the runtime (time.perf_counter_ns); its dispatch (Clock.now_ns) when it never
    launched (refused before a launcher took it, or an executor that stamps none) or the stamp is
    before it: a duration clock off the runtime's timeline (the Clock protocol asks for it; a
    test's manual clock, say) gave negative queue times, with no word."""
    return max(batch.launched_ns if launched_ns is None else launched_ns, batch.dispatched_ns)


class Delivery:
    """Resolves request futures on the event loop thread. With `ordered`, run outcomes are
    held until every earlier arrival is answered; requests answered outside a run (timed
    out, cancelled) leave the line at once and hold nobody."""

    def __init__(self, ordered: bool, stats: BatcherStats, name: str):
        self.ordered = ordered
        self._stats = stats
        self._name = name
        self._arrivals: collections.deque[QueuedRequest] = collections.deque()

    def arrived(self, request: QueuedRequest) -> None:
        if self.ordered:
            self._arrivals.append(request)

    def settle(self, batch: Batch, now_ns: int) -> None:
        """Answer every request of `batch` (its `requests` are QueuedRequests) with its own
        outputs or error (`batch.errors`), or all with the batch's error. `now_ns` is the
        duration clock's reading (Clock.now_ns) when the outcome arrived; `batch.dispatched_ns`
        is on the same clock, and so is the runtime's launch stamp (time.perf_counter_ns, which
        the Clock protocol asks now_ns to be on: LoopClock's is it). A request's queue time ends
        at the launch of the run that answered it, as Triton's ends at compute start (started())."""
        requests = batch.requests
        stats = self._stats
        observed = stats.has_request_observers
        outputs, error = batch.outputs, batch.error
        if error is None and (outputs is None or len(outputs) != len(requests)):
            error = ExecutionFailed(f"the runtime returned {len(outputs or ())} outputs for a "
                                    f"batch of {len(requests)} requests")
        start_ns = started(batch)  # (a run of a part its own: _executed)
        if error is not None:
            error = self._served(error)
            for request in requests:
                self._fail(request, error, start_ns)
            return
        ran = self._executed(batch, start_ns, now_ns)
        errors = batch.errors  # (set when a failed batch re-run one request per run had some fail)
        for index, (request, request_outputs) in enumerate(zip(requests, outputs)):
            if errors is not None and errors[index] is not None:
                self._fail(request, self._served(errors[index]), start_ns)
                continue
            if request.future.cancelled():
                continue  # counted once already: cancelled when its client went (it ran all the same)
            gear, rows, together, instance, launched_ns, (h2d, infer, d2h) = ran[index]
            queue_ns = launched_ns - request.enqueued_ns
            if observed:
                stats.request_done(request.level, queue_ns / 1e9, True, "")
            request.answered = (queue_ns, now_ns - request.enqueued_ns, h2d, infer, d2h)
            self.answer(request, InferenceResult(request_outputs, queue_ns, now_ns - launched_ns, gear, rows,
                                                 together, instance))

    def _executed(self, batch: Batch, start_ns: int, now_ns: int) -> list:
        """Record the successful runs that answered `batch` (started at `start_ns`, its result in at
        `now_ns`); per request, its run's (gear, rows, requests, instance, launch, (h2d, infer, d2h)
        ns). A batch re-run one request per run (runtime/isolation.py) failed as a whole: each part
        that succeeded is a run, with its own launch and figures; those that failed are none, as
        the whole is."""
        stats = self._stats
        if batch.runs is None:
            spent = stats.batch_executed(batch.gear, batch.rows, now_ns - start_ns, batch.timings)
            ran = (batch.gear, batch.rows, len(batch.requests), batch.instance, start_ns, spent)
            return [ran] * len(batch.requests)
        ran: list = [None] * len(batch.requests)
        for run in batch.runs:
            spent = stats.batch_executed(run.gear, run.rows, run.wall_ns, run.timings)
            ran[run.index] = (run.gear, run.rows, 1, run.instance, started(batch, run.launched_ns), spent)
        return ran

    def _served(self, error: BaseException) -> ServeError:
        if not isinstance(error, ServeError):
            log.error("batcher %s: batch failed", self._name, exc_info=error)
            error = ExecutionFailed(f"batch execution failed: {type(error).__name__}: {error}")
        return error

    def _fail(self, request: QueuedRequest, error: ServeError, started_ns: int) -> None:
        if request.future.cancelled():
            return  # counted once already: cancelled when its client went
        if self._stats.has_request_observers:
            self._stats.request_done(request.level, (started_ns - request.enqueued_ns) / 1e9, False, FAILED)
        # one exception object per request: a shared one would collect every awaiting task's traceback
        self.answer(request, type(error)(error.message))

    def answer(self, request: QueuedRequest, outcome) -> None:
        """A batch's outcome: held behind earlier arrivals when ordered."""
        if not self.ordered:
            self._resolve(request, outcome)
            return
        request.outcome = outcome
        self._release()

    def _resolve(self, request: QueuedRequest, outcome) -> None:
        """The outcome reaches the request; outputs count as a success then (stats)."""
        if request.future.done():
            return
        resolve(request.future, outcome)
        if request.answered is not None:
            self._stats.request_answered(request.rows, *request.answered)

    def answer_now(self, request: QueuedRequest, outcome) -> None:
        """An outcome from the queue (timeout): never held; it may unblock held ones."""
        resolve(request.future, outcome)
        if self.ordered:
            self._release()

    def refuse(self, requests, error: ServeError, reason: str, now_ns: int) -> None:
        """Queued `requests` that will never run, answered `error` now (counted as `reason`)."""
        for request in requests:
            self._stats.rejected(request.level, reason, now_ns - request.enqueued_ns)
            self.answer_now(request, type(error)(error.message))

    def left(self, request: QueuedRequest) -> None:
        """The request's future was cancelled (client gone): it may have held others."""
        if self.ordered:
            self._release()

    def _release(self) -> None:
        arrivals = self._arrivals
        while arrivals:
            head = arrivals[0]
            if not head.future.done():
                if head.outcome is None:
                    break
                self._resolve(head, head.outcome)
            arrivals.popleft()

    def fail_all(self, error: ServeError) -> None:
        """Shutdown: answer everything still held for ordering."""
        for request in self._arrivals:
            resolve(request.future, type(error)(error.message))
        self._arrivals.clear()
