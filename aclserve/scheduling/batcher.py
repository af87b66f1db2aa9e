"""DynamicBatcher: forms batches from the priority queue and feeds a model version's slots."""
from __future__ import annotations

import asyncio
import logging
import sys
from typing import Mapping

import numpy as np

from ..errors import (DeviceFailed, ExecutionFailed, InvalidInput, ModelUnavailable, QueueFull, RequestTimeout,
                      ServeError, ShuttingDown)
from ..runtime.batch import Batch, BatchExecutor
from ..trace.records import form_batch, queued
from .clock import Clock, LoopClock
from .company import Company
from .composition import Composer
from .delivery import Delivery, resolve
from .early_admission import EarlyAdmission
from .formation import Formation, GearTimes
from .gears import GearPlanner, batch_limit, one_request_per_run
from .policy import BatchingConfig
from .queue import PriorityQueue, rejecting_deadline
from .request import DISPATCHED, InferenceResult, QueuedRequest, mark_answered
from .stats import FAILED, QUEUE_FULL, SHUTDOWN, TIMEOUT, BatcherStats
from .unread import UnreadAdmissions

log = logging.getLogger(__name__)


class DynamicBatcher(EarlyAdmission):
    """Queues the requests of one model version and runs them in batches on its executor.

    Ownership: owns the PriorityQueue, the Formation bookkeeping, one timer (a batch window's end or
    a busy instance's moment) and the loop task ("batcher:<name>"); the executor is borrowed. The
    batcher is the executor's BatchListener: `batch_done()` and `slot_free()` come from the
    executor's threads and only hop to the loop with `call_soon_threadsafe` (one hop per finished
    batch, one per freed slot); everything else runs on the loop.

    When a batch is formed (`batch_formation`, see formation.py): a batch is committed once formed,
    so it is formed as late as the device allows. An idle instance takes one at once. A busy
    instance takes its next batch when its compute stream is about to need it: at the predicted
    result time of the batch it runs (from that batch's start and its gear's measured times) minus
    the lead (the non-compute time of a run: packing, copy-in, hand-offs), so at most one batch
    waits behind the executing one and a request of a higher level that arrives before that moment
    goes into that batch. `when_slot_free` forms a batch as soon as any slot is free instead (the
    rule before; a comparison baseline).

    What a batch holds and on which gears it runs: composition.py (requests in priority order while
    they fit `batch_limit`, waiting up to `max_queue_delay_ms` for a fuller one; a lone request
    waits so too while arrivals overlap others pending: company.py). Requests are never split: one
    with more rows than `batch_limit` is refused with InvalidInput.

    Cancellation: if the task awaiting `infer()` is cancelled, a queued request is removed at once;
    a running one has its result dropped. Failures of a run fail only its requests; a scheduling
    error fails the requests it was handling and batching goes on. A run that fails with
    DeviceFailed when the executor can run nothing again (`failed_for_good`: every instance on a
    device that failed as a whole) fails the queued requests, and those that come later, with it.
    `drain()` refuses new requests and waits for the rest; `close()` (idempotent) stops the loop and
    fails whatever is left with ShuttingDown.

    The early refusals' questions about the default level (admit_unread, default_level_full and the
    rest) are EarlyAdmission's: early_admission.py.
    """

    def __init__(self, executor: BatchExecutor, config: BatchingConfig | None = None,
                 name: str = "model", clock: Clock | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.config = config = config or BatchingConfig()
        self.name = name
        self._executor = executor
        self.gears = tuple(executor.gears)
        self.static = not self.gears
        self.batch_limit = batch_limit(self.gears, config)  # 0 for a static model
        self._loop = loop
        self._clock = clock
        self._queue: PriorityQueue | None = None
        self.stats = BatcherStats(range(1, config.priority_levels + 1), self.queue_depth)
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._listening = False
        self._timer = None  # the batch window's end or a busy instance's moment
        self._timer_at = 0.0
        self._formation = Formation(GearTimes(self.gears, executor.gear_cost or {},
                                              executor.compute_cost or {}),
                                    config.batch_formation)
        planner = GearPlanner(self.gears, executor.gear_cost or {}, self.batch_limit) if self.gears else None
        self._composer = Composer(self.gears, planner, self.batch_limit, not one_request_per_run(self.gears, config),
                                  config.max_queue_delay_ms / 1000.0, self._formation.just_in_time)
        self._running: set[Batch] = set()
        self._delivery = Delivery(config.preserve_ordering, self.stats, name)
        self._refusal: tuple[type[ServeError], str] | None = None
        self._draining = False
        self._drained: asyncio.Future | None = None
        self._closed = False
        self._unread = UnreadAdmissions()  # EarlyAdmission's: let in by admit_unread(), not arrived yet
        self._company = Company()  # whether a lone request waits for others

    # -- public API --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop task (idempotent; `infer()` starts it too). Needs the event loop."""
        if self._task is not None or self._closed:
            return
        loop = self._loop = self._loop or asyncio.get_running_loop()
        if self._queue is None:
            self._clock = self._clock or LoopClock(loop)
            self._queue = PriorityQueue(self.config, self._clock, self._on_timeout, self._on_delay)
            self._wakeup = asyncio.Event()
        if not self._listening:
            self._executor.attach(self)
            self._listening = True
        self._task = loop.create_task(self._run(), name=f"batcher:{self.name}")
        self._task.add_done_callback(self._task_ended)
        self._wakeup.set()

    async def infer(self, inputs: Mapping[str, np.ndarray], rows: int, priority: int | None = None,
                    timeout_us: int | None = None, trace=None, waited_ns: int = 0) -> InferenceResult:
        """Queue one request (`rows` = its batch dimension) and wait for its own outputs.
        `trace` (a sampled request's trace.RequestTrace) gets its queue times and its batch.
        `waited_ns`: what it waited for a decode thread before, which its deadline counts.

        Raises QueueFull, RequestTimeout, InvalidInput, ExecutionFailed, ModelUnavailable
        (draining) or ShuttingDown."""
        if self._refusal is not None:
            error, message = self._refusal
            raise error(message)
        if not self.static and not 1 <= rows <= self.batch_limit:
            if rows < 1:
                raise InvalidInput(f"batch of {rows} rows: the batch dimension must be at least 1")
            raise InvalidInput(f"batch of {rows} rows exceeds the model's maximum batch size "
                               f"{self.batch_limit}")
        if self._task is None:
            self.start()
        queue = self._queue
        level = queue.level_for(priority)
        request = QueuedRequest(inputs, rows, level, self._clock.now(), self._loop.create_future(),
                                self._clock.now_ns(), trace)
        request.waited_ns = waited_ns
        self._company.arrived(queue.count > 0 or bool(self._running))
        try:
            queue.push(request, timeout_us, chosen=level == priority)  # (None, 0 or out of range: not)
        except QueueFull:
            self.stats.rejected(level, QUEUE_FULL)
            raise
        self.stats.levels[level].accepted += 1
        if trace is not None:
            queued(trace, request)
        self._delivery.arrived(request)
        self._wakeup.set()
        try:
            return await request.future
        except asyncio.CancelledError as cancelled:
            if self._abandon(request):
                mark_answered(cancelled)
            raise

    async def drain(self, timeout: float | None = None) -> bool:
        """Refuse new requests (ModelUnavailable) and wait until every queued and running one
        is answered. True when drained, False on timeout (nothing is cancelled then)."""
        if self._refusal is None:
            self._refusal = (ModelUnavailable, f"model version {self.name} is draining")
        self._draining = True
        if self._idle():
            return True
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._drained), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        """Stop the loop task and fail anything queued or running with ShuttingDown."""
        if self._closed:
            return
        self._closed = True
        if self._refusal is None or self._refusal[0] is not ShuttingDown:
            self._refusal = (ShuttingDown, f"model version {self.name} is shutting down (unloaded, replaced, "
                                           "or the server is stopping)")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        message = self._refusal[1]
        if self._queue is not None:
            for request in self._queue.take_all():
                self.stats.rejected(request.level, SHUTDOWN, self._clock.now_ns() - request.enqueued_ns)
                resolve(request.future, ShuttingDown(message))
        batches, self._running = self._running, set()
        for batch in batches:
            for request in batch.requests:
                resolve(request.future, ShuttingDown(message))
        self._delivery.fail_all(ShuttingDown(message))
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def deadline_s(self, priority: int | None, timeout_us: int | None) -> float:
        """Seconds a request may wait, for a decode thread and then queued, before its deadline
        refuses it (RequestTimeout); 0 for none (queue.rejecting_deadline)."""
        return rejecting_deadline(self.config, priority, timeout_us)

    def queue_depth(self) -> dict[int, int]:
        return self._queue.depths() if self._queue is not None else {}

    @property
    def pending(self) -> int:
        """Requests queued or running."""
        queued = self._queue.count if self._queue is not None else 0
        return queued + sum(len(batch.requests) for batch in self._running)

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        wakeup = self._wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            self._schedule()

    def _task_ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._closed or task is not self._task:
            return
        log.error("batcher %s: loop task died; restarting it", self.name, exc_info=task.exception())
        self._task = None
        self.start()

    def _schedule(self) -> None:
        """Dispatch runs while an instance takes a batch and one is ready. Never raises: an
        error fails the requests being handled (the head of the queue if none was taken yet),
        so every error makes progress and no request hangs on a broken scheduler."""
        queue = self._queue
        while queue.count:
            batch = None
            try:
                ready, later = self._formation.choose(self._executor.lanes(), self._clock.now())
                if not ready:
                    if later is not None:
                        self._arm_timer(later)
                    return  # the timer, a result or a freed slot wakes us
                lane, capacity = ready[0]
                batch, window_end = self._composer.next_batch(queue, self._clock.now(),
                                                              self._company.expected)
                if batch is None:
                    self._arm_timer(window_end)
                    return  # the window timer or an arrival wakes us
                if not batch:
                    raise RuntimeError("the queue head does not fit in a batch")
                runs = self._composer.plan(batch, capacity)
            except Exception as exc:
                log.exception("batcher %s: scheduling failed", self.name)
                victims = batch or queue.take(sys.maxsize, 1)
                failed = Batch((), None, 0, requests=victims, dispatched_ns=self._clock.now_ns())
                failed.error = ExecutionFailed(f"internal batching error: {type(exc).__name__}")
                self._settle(failed, tracked=False)
                continue
            for requests, gear in runs:
                self._submit(requests, gear, lane)

    def _arm_timer(self, at: float) -> None:
        """Wake the loop at `at` (a batch window's end, or a busy instance's moment); the
        earliest pending moment wins, and each wake-up re-arms what is still ahead."""
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_at(at, self._timer_fired)

    def _timer_fired(self) -> None:
        """Schedule right here: going through the loop task would cost one more loop
        iteration, which under load (many requests read in one) can take milliseconds."""
        self._timer = None
        if not self._closed and self._queue is not None:
            self._schedule()

    def _submit(self, requests: list[QueuedRequest], gear: int | None, lane: int) -> None:
        now = self._clock.now_ns()
        rows, traced = 0, False
        for request in requests:
            request.state = DISPATCHED
            rows += request.rows
            traced = traced or request.trace is not None
        trace = form_batch(self.name, requests, gear, now) if traced else None
        batch = Batch([request.inputs for request in requests], gear, rows, lane, trace, requests, now)
        self._running.add(batch)  # from here on, _settle answers these requests whatever happens
        self._formation.booked(lane, batch, self._clock.now())
        try:
            self._executor.submit(batch)
        except Exception as exc:  # refused outright (a bug: the batcher formed what cannot run)
            if batch in self._running:
                batch.error = exc
                self._settle(batch)

    # -- BatchListener: the executor's threads hop to the loop here ---------------------------------

    def batch_done(self, batch: Batch) -> None:
        """`batch` finished (outputs or error set). Any thread."""
        try:
            self._loop.call_soon_threadsafe(self._settle, batch)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these answers any more

    def slot_free(self) -> None:
        """The executor can take another batch. Any thread."""
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:
            pass  # loop closed

    def _settle(self, batch: Batch, tracked: bool = True) -> None:
        """Answer every request of `batch` once (result or error), then look for more work."""
        if tracked:
            if batch not in self._running:
                return  # close() answered it already
            self._running.discard(batch)
            now = self._clock.now()
            self._formation.finished(batch.lane, batch, now, batch.timings.compute_ms / 1000.0,
                                     self._queue is not None and self._queue.count > 0)
        self._delivery.settle(batch, self._clock.now_ns())
        if isinstance(batch.error, DeviceFailed) and not self._closed and (why := self._executor.failed_for_good()):
            self._refusal = (DeviceFailed, f"model version {self.name}: {why}")  # (the class docstring)
            self._delivery.refuse(self._queue.take_all(), DeviceFailed(self._refusal[1]), FAILED, self._clock.now_ns())
        if not self._closed:
            self._wakeup.set()
        if self._draining:
            self._check_drained()

    # -- queue events -----------------------------------------------------------------------------

    def _on_timeout(self, request: QueuedRequest) -> None:
        waited = self._clock.now_ns() - request.enqueued_ns
        self.stats.rejected(request.level, TIMEOUT, waited)
        why = self._executor.out_of_service()  # (a timeout said nothing of the device fault behind it)
        before = f" (and {_milliseconds(request.waited_ns)} for a decode thread before it)" if request.waited_ns else ""
        self._delivery.answer_now(request, RequestTimeout(
            f"request timed out after {_milliseconds(waited)} in the queue{before}" + (f" ({why})" if why else "")))
        if self._draining:
            self._check_drained()

    def _on_delay(self, request: QueuedRequest) -> None:
        self.stats.levels[request.level].delayed += 1

    def _abandon(self, request: QueuedRequest) -> bool:
        """The awaiting task was cancelled (client gone). True when its outputs had reached it
        first (the statistics counted it a success: its task was cancelled before it resumed)."""
        future = request.future
        if not future.cancelled():
            return future.done() and future.exception() is None  # it had been answered already
        waited = self._clock.now_ns() - request.enqueued_ns
        if self._queue.remove(request) or request.state == DISPATCHED:
            self.stats.cancelled(request.level, waited)
        self._delivery.left(request)
        if self._draining:
            self._check_drained()
        return False

    def _idle(self) -> bool:
        return not self._running and (self._queue is None or not self._queue.count)

    def _check_drained(self) -> None:
        if self._drained is not None and not self._drained.done() and self._idle():
            self._drained.set_result(None)


def _milliseconds(ns: int) -> str:
    """A wait in ms, to the tenth; below 1 ms to the microsecond (a `timeout` of 1 us said "after 0.0 ms")."""
    return f"{ns / 1e6:.1f} ms" if ns >= 1_000_000 else f"{ns / 1e6:.3f} ms"
