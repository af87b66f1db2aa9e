"""Streams and events of the CPU runtime.

A Stream owns one daemon worker thread that runs its tasks in FIFO order. A task is a callable
returning an ACL code; the first non-zero code is kept and handed to the next synchronize (then
cleared), like an asynchronous device error. Waits use threading.Condition, so they release the
GIL and never poll.

An Event counts records: record() enqueues a marker on a stream, and the event is complete once
the marker of its latest record has run (an event never recorded is complete). The marker also
takes the error of the work enqueued between the previous marker on that stream and itself, so
synchronizing the event reports a failure of exactly that work, and a later batch on the same
stream is not blamed for it (the stream keeps its first error too, until synchronize_stream
reports and clears it).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

from .. import constants as C

log = logging.getLogger("aclserve.acl.cpu")


class Stream:
    """FIFO of tasks run by its own thread. Owned by a context; close() drains and joins."""

    def __init__(self, handle: int, context):
        self.handle = handle
        self.context = context
        self.device = context.device
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._enqueued = 0
        self._done = 0
        self._error = 0
        self._error_since_marker = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"acl-cpu-stream-{handle:#x}", daemon=True)
        self._thread.start()

    def enqueue(self, task) -> int:
        with self._cond:
            if self._closed:
                return C.ACL_ERROR_RT_PARAM_INVALID
            self._queue.append(task)
            self._enqueued += 1
            self._cond.notify_all()
        return C.ACL_SUCCESS

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                task = self._queue.popleft()
            try:
                ret = task()
            except Exception:
                log.exception("stream %#x: task failed", self.handle)
                ret = C.ACL_ERROR_RT_INTERNAL_ERROR
            with self._cond:
                if ret and not self._error:
                    self._error = ret
                if ret and not self._error_since_marker:
                    self._error_since_marker = ret
                self._done += 1
                self._cond.notify_all()

    def synchronize(self, timeout_s: float | None = None) -> int:
        """Wait for the work enqueued so far; return (and clear) the first async error."""
        with self._cond:
            target = self._enqueued
            if not self._cond.wait_for(lambda: self._done >= target, timeout_s):
                return C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
            err, self._error = self._error, 0
            return err

    def take_marker_error(self) -> int:
        """The first error since the previous event marker, cleared (called by event markers)."""
        with self._cond:
            err, self._error_since_marker = self._error_since_marker, 0
            return err

    def close(self, timeout_s: float | None = None) -> None:
        """Let the worker finish what is queued, then stop it. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("stream %#x: worker still busy after close", self.handle)


class Event:
    """Completion marker recorded on streams; owned by a context, closed by destroy_event."""

    def __init__(self, handle: int, context, flags: int | None = None, reusable: bool = False):
        self.handle = handle
        self.context = context
        self.device = context.device
        self.flags = flags  # those of create_event(_ex)_with_flag; None: create_event's, every use
        # create_event_ex_with_flag's: recorded again as it is, each record replacing the last
        # (CANN); any other waited on by a stream is reset before its next record (record, wait, reset)
        self.reusable = reusable
        self.waited = False  # not reusable: a stream waited on it since its last record, no reset since
        self._cond = threading.Condition()
        self._recorded = 0
        self._completed = 0
        self.timestamp: float | None = None
        self.error = 0  # the error of the work between the previous marker and the latest record

    def record(self, stream: Stream) -> int:
        with self._cond:
            self._recorded += 1
            generation = self._recorded
        return stream.enqueue(lambda: self._complete(generation, stream))

    def _complete(self, generation: int, stream: Stream) -> int:
        error = stream.take_marker_error()
        with self._cond:
            if generation > self._completed:
                self._completed = generation
                self.timestamp = time.perf_counter()
                self.error = error
            self._cond.notify_all()
        return C.ACL_SUCCESS

    def wait(self, timeout_s: float | None = None, generation: int | None = None) -> bool:
        with self._cond:
            target = self._recorded if generation is None else generation
            return self._cond.wait_for(lambda: self._completed >= target, timeout_s)

    def waiter(self):
        """A stream task that waits for the record current at this call (stream_wait_event)."""
        with self._cond:
            target = self._recorded
        return lambda: (self.wait(None, target), C.ACL_SUCCESS)[1]

    def reset(self) -> int:
        """reset_event, when its stream gets there: back to never recorded (no time, complete)."""
        with self._cond:
            self._completed = self._recorded
            self.timestamp = None
        return C.ACL_SUCCESS

    def complete(self) -> bool:
        with self._cond:
            return self._completed >= self._recorded

    def finished_timestamp(self) -> float | None:
        with self._cond:
            if self._recorded == 0 or self._completed < self._recorded:
                return None
            return self.timestamp
