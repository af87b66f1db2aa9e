"""Streams and events of the CPU runtime.

A Stream owns one daemon worker thread that runs its tasks in FIFO order. A task is a callable
returning an ACL code; the first non-zero code is kept and handed to the next synchronize (then
cleared), like an asynchronous device error.

An Event counts records: record() enqueues a marker on a stream, and the event is complete once
the marker of its latest record has run (an event never recorded is complete). Synchronizing an
event does not report a failure of the work before it, as on the device in its default mode
(ACL_CONTINUE_ON_FAILURE: the stream runs on, and CANN's runtime checks only the context's
stop-on-failure state in an event's synchronize, hicann/runtime Context::CheckStatus): only
synchronize_stream does. A context whose stream was set to ACL_STOP_ON_FAILURE
(set_stream_failure_mode) keeps the first failure of any of its streams' work instead: its
streams then skip the work queued (events still complete, so waits end), every synchronize of
its streams and events returns that failure at once (CANN checks the context before and while
it waits: the waits under way end when it stops), as does an event's query, and it takes no new
task (CANN: "no new task after a stop on failure"). abort() (acl.rt.stream_abort) drops a
stream's queued work and its waits for events, and waits for the task running, which a CPU
thread cannot stop midway (ABORT_WAIT_S at most: past it, 507000). A device that failed as a
whole (faults.py, `device`) takes no task on any stream (enqueue), and the work its streams
still hold fails with its code, which their next synchronize reports.

Waits block on a lock of their own that the worker releases (Waiters), and the tasks reach the
worker through a queue.SimpleQueue: both are C code, which threading.Condition is not. A batch
makes a dozen calls here (its copies, execution and events), and each one through a Condition
cost several microseconds of the host core that an NPU's stream does not take.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from .. import constants as C
from . import _async_host, _err_msg, faults

log = logging.getLogger("aclserve.acl.cpu")

_STOP = object()  # the worker's last task (close)
# How long stream_abort waits for the task running to end (the device stops it; a CPU thread
# cannot be stopped midway, so a task held past this makes the abort fail)
ABORT_WAIT_S = 2.0


class Waiters:
    """Threads blocked until a count reaches their target, each on its own lock. The owner
    holds its own lock around add(), wake() and forget()."""

    __slots__ = ("_blocked",)

    def __init__(self):
        self._blocked: list[tuple[int, threading.Lock]] = []

    def add(self, target: int) -> threading.Lock:
        """A lock, held, that wake() releases once the count reaches `target`."""
        gate = threading.Lock()
        gate.acquire()
        self._blocked.append((target, gate))
        return gate

    def wake(self, count: int) -> None:
        if not self._blocked:
            return
        still = []
        for target, gate in self._blocked:
            if target <= count:
                gate.release()
            else:
                still.append((target, gate))
        self._blocked = still

    def wake_all(self) -> None:
        """Every wait wakes (its context stopped on a failure, or an abort drops a stream's
        wait): each reads its owner's state again (wait_until)."""
        for _, gate in self._blocked:
            gate.release()
        self._blocked = []

    def forget(self, gate: threading.Lock) -> None:
        """A wait that timed out: wake() no longer releases its gate."""
        self._blocked = [(t, g) for t, g in self._blocked if g is not gate]


def block(owner_lock: threading.Lock, waiters: Waiters, gate: threading.Lock, timeout_s: float | None) -> bool:
    """Wait on `gate` (from waiters.add, the owner's lock released): True once released, False
    past `timeout_s` (None: forever)."""
    if gate.acquire(timeout=-1 if timeout_s is None else timeout_s):
        return True
    with owner_lock:
        waiters.forget(gate)
    return gate.acquire(blocking=False)  # released between the timeout and forget()


def wait_until(owner_lock: threading.Lock, waiters: Waiters, target: int, ready: Callable[[], bool],
               timeout_s: float | None) -> bool:
    """Block until `ready()` (read under the owner's lock, again at each wake-up: wake_all wakes
    waits whose count has not come) or past `timeout_s` (None: forever). Whether it is ready."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with owner_lock:
            if ready():
                return True
            gate = waiters.add(target)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not block(owner_lock, waiters, gate, left):
            return False


class Stream:
    """FIFO of tasks run by its own thread. Owned by a context; close() drains and joins."""

    def __init__(self, handle: int, context):
        self.handle = handle
        self.context = context
        self.device = context.device
        self._lock = threading.Lock()  # the counts, the first error, closing, the waiters
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._waiters = Waiters()  # synchronize calls
        self._enqueued = 0
        self._done = 0
        self._error = 0
        self._error_message: str | None = None  # what the task that failed first said (_err_msg.py)
        self._dropped = 0  # abort(): the work among the first `_dropped` tasks is not run
        # what its running task waits for: an event (stream_wait_event), or a resource for a record
        # (an _event_pool.Claim); abort() and close() wake it
        self.waiting_on = None
        self.failure_mode = C.ACL_CONTINUE_ON_FAILURE  # set_stream_failure_mode's
        self.closed = False  # close(): no new task; a record's wait for a resource gives up
        self._thread = threading.Thread(target=self._run, name=f"acl-cpu-stream-{handle:#x}", daemon=True)
        self._thread.start()

    def enqueue(self, task, marker: bool = False, taken: Callable[[int], None] | None = None) -> int:
        """Queue `task`: work (a copy, an execution, a host callback) or, `marker`, an event's
        record, wait or reset, which runs even after its context stopped on a failure. Every
        task submitted on a stream comes here: one under a stopped context, or on a device that
        failed as a whole, is refused (CANN: Context::CheckTaskSend). `taken` is called once the
        task is accepted, before the worker can run it, with the task's number for ran()
        (a copy's host side: _async_host.py)."""
        failure = self.context.refusal()
        if failure:  # stopped on a failure, or the device failed: no new task (CANN)
            return failure
        with self._lock:
            if self.closed:
                return C.ACL_ERROR_RT_PARAM_INVALID
            if taken is not None:
                taken(self._enqueued + 1)
            self._enqueued += 1
            self._tasks.put((task, marker))
        return C.ACL_SUCCESS

    def _run(self) -> None:
        get, lock, context = self._tasks.get, self._lock, self.context
        while True:
            item = get()
            if item is _STOP:
                return
            task, marker = item
            message = None
            faults.trigger("stream", -1)  # an injected delay of every task (none: returns at once)
            if not marker and (context.failure or self.dropping()):
                ret = C.ACL_SUCCESS  # stopped on a failure, or aborted: the work queued is not run
            elif not marker and context.refusal():  # the device failed as a whole: its work queued fails
                ret = context.refusal()
            else:
                try:
                    ret = task()
                except Exception:
                    log.exception("stream %#x: task failed", self.handle)
                    ret = C.ACL_ERROR_RT_INTERNAL_ERROR
                if ret:
                    message = _err_msg.take()  # (said in this thread: it goes with the code to a synchronize)
                    context.task_failed(ret, message)
            with lock:
                if ret and not self._error:
                    self._error, self._error_message = ret, message
                self._done += 1
                self._waiters.wake(self._done)

    def synchronize(self, timeout_s: float | None = None) -> int:
        """Wait for the work enqueued so far; return (and clear) the first async error, or the
        failure its context stopped on (at once: CANN checks the context before and while it
        waits); what the failed task said becomes the calling thread's error message."""
        with self._lock:
            if self.context.failure:  # (set before its waits are woken, under this lock)
                return self.context.failure_told()
            target = self._enqueued
            gate = self._waiters.add(target) if self._done < target else None
        if gate is not None and not block(self._lock, self._waiters, gate, timeout_s):
            return C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        with self._lock:
            err, self._error = self._error, 0
            message, self._error_message = self._error_message, None
            if self.context.failure:
                return self.context.failure_told()
            if err and message:
                _err_msg.report(message)
            return err

    def set_failure_mode(self, mode: int) -> int:
        """set_stream_failure_mode: the mode it has already is taken again, stop back to continue
        is refused (hicann/runtime ApiImpl::StreamSetMode); ACL_STOP_ON_FAILURE stops its whole
        context (CANN: the other streams of the context stop on a failure too)."""
        with self._lock:
            if mode == self.failure_mode:
                return C.ACL_SUCCESS
            if self.failure_mode == C.ACL_STOP_ON_FAILURE:
                return C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
            self.failure_mode = mode
        self.context.stop_on_failure = True
        return C.ACL_SUCCESS

    def abort(self) -> int:
        """stream_abort: the work and the event waits queued are dropped, a wait running too
        (its event records still run, so others' waits end), and the task running is waited for
        (ABORT_WAIT_S at most); the next synchronize
        reports 107023 (ACL_ERROR_RT_STREAM_ABORT) once, where no other error comes first."""
        with self._lock:
            target = self._dropped = self._enqueued
            running = self._done + 1  # (or the next to start: its work may be under way)
            self._error = self._error or C.ACL_ERROR_RT_STREAM_ABORT  # (a synchronize under way reads it)
        self._wake_running_wait()  # a wait task is dropped too (it looks at dropping() when woken)
        _async_host.forget(self, running + 1, target)  # the copies it drops no longer own their host side
        if not wait_until(self._lock, self._waiters, target, lambda: self._done >= target, ABORT_WAIT_S):
            log.error("stream %#x: abort: the task running did not end within %.0f s (a CPU "
                      "thread cannot be stopped midway)", self.handle, ABORT_WAIT_S)
            return C.ACL_ERROR_RT_INTERNAL_ERROR
        log.debug("stream %#x: aborted", self.handle)
        return C.ACL_SUCCESS

    def ran(self, number: int) -> bool:
        """Whether its task `number` (enqueue's count) is done: run, skipped or dropped (an int read,
        without the lock: taken under another stream's)."""
        return self._done >= number

    def dropping(self) -> bool:
        """Whether the task running now is one an abort dropped."""
        return self._done < self._dropped

    def _wake_running_wait(self) -> None:
        """The wait its running task is in (if any) looks again at whether to give up (after
        `_dropped` or `closed` changed: a task that starts waiting later reads them first)."""
        waited = self.waiting_on
        if waited is not None:
            waited.wake_waits()

    def wake_waits(self) -> None:
        with self._lock:
            self._waiters.wake_all()

    def close(self, timeout_s: float | None = None) -> None:
        """Let the worker finish what is queued, then stop it. Idempotent. A record queued that
        waits for an event resource gives up that wait (it completes without one): on the device
        the recording thread got its resource before the record was queued, so nothing queued
        waits for one, and the join would wait for a release that may never come."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._tasks.put(_STOP)
        self._wake_running_wait()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("stream %#x: worker still busy after close", self.handle)
        _async_host.forget(self)  # (its copies' host spans, which kept it alive until another copy's call)


class Event:
    """Completion marker recorded on streams; owned by a context, closed by destroy_event."""

    def __init__(self, handle: int, context, flags: int | None = None, reusable: bool = False, holding=None,
                 taken=None):
        self.handle = handle
        self.context = context
        self.device = context.device
        self.flags = flags  # those of create_event(_ex)_with_flag; None: create_event's, every use
        # create_event_ex_with_flag's: recorded again as it is, each record replacing the last
        # (CANN); any other waited on by a stream is reset before its next record (record, wait, reset)
        self.reusable = reusable
        self.waited = False  # not reusable: a stream waited on it since its last record, no reset since
        self._lock = threading.Lock()
        self._waiters = Waiters()
        self._recorded = 0
        self._completed = 0
        self.timestamp: float | None = None
        self.stream: Stream | None = None  # the stream of its latest record (event_elapsed_time pairs)
        # the device's event resources it takes at each record (_event_pool.Holding), or the one it
        # took as it was made (_event_pool.Taken); None: none
        self.holding, self.taken = holding, taken

    def record(self, stream: Stream) -> int:
        """Queue a record; one the stream refuses (its context stopped) is not counted, so no
        wait is left for a record that never runs. A record that takes an event resource claims
        it here and, when none is left, its stream waits for one (_event_pool.py). (The event's
        lock, then the stream's: no path takes them the other way.)"""
        holding = self.holding
        with self._lock:
            generation = self._recorded + 1
            claim = None if holding is None else holding.claim(generation)  # None: got one (or takes none)
            ret = stream.enqueue(lambda: self._complete(generation, stream, claim), marker=True)
            if ret == C.ACL_SUCCESS:
                self._recorded, self.stream = generation, stream
            elif holding is not None:
                holding.refused(generation, claim)
        return ret

    def _complete(self, generation: int, stream: Stream, claim) -> int:
        holding = self.holding
        if claim is not None:  # none was left at the record: its stream waits for one
            holding.obtain(generation, claim, stream)
        with self._lock:
            if generation > self._completed:
                self._completed = generation
                self.timestamp = time.perf_counter()
                self._waiters.wake(generation)
        if holding is not None:
            holding.ran(generation)
        return C.ACL_SUCCESS

    def wait(self, timeout_s: float | None = None) -> bool:
        """A host's wait for the latest record; it also ends when the context stops on a failure
        (its caller reports it). A stream's wait (waiter) does not: on the device a stream
        waiting for a stopped stream's event stays stalled."""
        with self._lock:
            target = self._recorded
        return wait_until(self._lock, self._waiters, target,
                          lambda: self._completed >= target or bool(self.context.failure), timeout_s)

    def wake_waits(self) -> None:
        with self._lock:
            self._waiters.wake_all()

    def queue_wait(self, stream: Stream) -> int:
        """Queue on `stream` a task that waits for the record current at this call
        (stream_wait_event), unless the stream's abort drops it meanwhile (as the device drops a
        wait task); that record's event resource is kept until it ends."""
        holding = self.holding
        with self._lock:
            target = self._recorded
            if holding is not None:
                holding.wait_begins(target)

            def wait() -> int:
                stream.waiting_on = self
                try:
                    wait_until(self._lock, self._waiters, target,
                               lambda: self._completed >= target or stream.dropping(), None)
                finally:
                    stream.waiting_on = None
                    if holding is not None:
                        holding.wait_ends(target)
                return C.ACL_SUCCESS
            ret = stream.enqueue(wait, marker=True)
        if ret != C.ACL_SUCCESS and holding is not None:
            holding.wait_ends(target)
        return ret

    def destroyed(self) -> None:
        """destroy_event, or its context gone: its resources go back once what holds them ran, and
        a record of it waiting for one gives up (_event_pool.Holding.obtain)."""
        if self.holding is not None:
            self.holding.destroyed()
        if self.taken is not None:
            self.taken.destroyed()

    def reset(self) -> int:
        """reset_event, when its stream gets there: back to never recorded (no time, complete)."""
        with self._lock:
            self._completed = self._recorded
            self.timestamp = None
            self._waiters.wake(self._completed)
        return C.ACL_SUCCESS

    def complete(self) -> bool:
        with self._lock:
            return self._completed >= self._recorded

    def finished_timestamp(self) -> float | None:
        with self._lock:
            if self._recorded == 0 or self._completed < self._recorded:
                return None
            return self.timestamp
