"""DecodePool: the bounded decode threads every model's pictures share, off the event loop.

Owned by the server state (one per server, shared by every model) and closed at shutdown. A
request's pictures are one map call, taken by the threads in turn with other requests' (turns.py).
A call that ends before its pictures are all taken drops those not started at once, letting
them go; those decoding run on (a thread cannot be stopped inside Pillow): its caller cancelled
(the client gone), a picture refused, or its wait for a thread past its deadline. At most
`max_pending` pictures are waiting or decoding at once, counted until their decode ends; a
request that would pass the bound gets QueueFull (503) at once rather than holding its body in
memory while it waits. workers = 0 decodes on the calling (event loop) thread: only for
measuring what the pool buys.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Callable, NamedTuple, Sequence

from ..errors import Overloaded, PayloadTooLarge, QueueFull, RequestTimeout, ShuttingDown
from .turns import Submission, Turns

log = logging.getLogger(__name__)
TIMER_TICK_S = 0.001  # a deadline timer found early (uvloop counts whole ms) is set again for at least this


class Decoded(NamedTuple):
    results: list
    waited_ns: int  # from the call until a thread took its first item (0 on the loop, or with none)


class DecodePool:
    def __init__(self, workers: int, max_pending: int):
        self.workers = workers
        self.max_pending = max_pending
        self.pending = 0  # event-loop thread only
        self._closed = False
        self._turns = Turns()
        self._threads: list[threading.Thread] = []

    async def map(self, fn: Callable, items: Sequence, on_ended: Callable[[], None] | None = None,
                  wait_s: float = 0.0) -> Decoded:
        """[fn(item) for item in items] in the pool's threads, each item a job, taken in turn with
        other calls' (turns.py). A failed item's exception is raised (the first by item order)
        once the items started have ended, those not started dropped. `wait_s` (0: none): the
        longest wait until a thread takes the call's first item; past it, its items are dropped
        and RequestTimeout raised. `on_ended` is called on the loop once every item has ended
        (decoded, failed, or dropped before it began), or at once when none was queued: also
        when the caller was cancelled meanwhile, whose items decoding run on."""
        call = _Call(on_ended)
        try:
            return await self._map(fn, items, call, wait_s)
        finally:
            call.queued_all()

    async def _map(self, fn: Callable, items: Sequence, call: "_Call", wait_s: float) -> Decoded:
        if self._closed:
            raise ShuttingDown("server is shutting down")
        if not self.workers:
            return Decoded([fn(item) for item in items], 0)
        n = len(items)
        if n > self.max_pending:  # never fits, however long its client waits: not a retry-later
            raise PayloadTooLarge(f"the request holds {n} images, more than are decoded at once "
                                  f"({self.max_pending}: images.max_pending); send fewer per request")
        if self.pending + n > self.max_pending:
            raise QueueFull(f"image decoding is saturated ({self.pending} images pending, limit "
                            f"{self.max_pending}: images.max_pending); retry later")
        if not n:
            return Decoded([], 0)
        loop = asyncio.get_running_loop()
        submission = Submission(fn, items, functools.partial(self._report, loop, call))
        self._start_threads(self.pending + n)
        call.begin(n, loop.create_future())
        self.pending += n
        queued_ns = time.perf_counter_ns()
        self._turns.put(submission)
        if wait_s > 0:
            call.timer = loop.call_later(wait_s, self._wait_due, call, submission, queued_ns, wait_s)
        try:
            await call.done
        except asyncio.CancelledError:
            self._drop(call, submission)
            raise
        finally:
            if call.timer is not None:
                call.timer.cancel()
        if call.timed_out_ns:
            raise RequestTimeout(f"request timed out after {call.timed_out_ns / 1e6:.1f} ms waiting for a decode "
                                 f"thread (the {self.workers} of images.workers decoding other requests' pictures; "
                                 f"{self.pending} pictures waiting or decoding); the queue's deadline counts this "
                                 f"wait")
        if call.errors:
            raise min(call.errors, key=lambda failed: failed[0])[1]
        return Decoded(call.results, submission.first_taken_ns - queued_ns if submission.first_taken_ns else 0)

    def _start_threads(self, wanted: int) -> None:
        """Threads up to `wanted` (at most `workers`). Raises Overloaded when none can start."""
        while len(self._threads) < min(wanted, self.workers):
            thread = threading.Thread(target=self._work, name=f"aclserve-decode_{len(self._threads)}", daemon=True)
            try:
                thread.start()
            except RuntimeError as e:  # "can't start new thread": the process's limit
                if self._threads:
                    return  # those running take the pictures in turn
                raise Overloaded(f"image decoding cannot start a thread ({e}); retry later") from None
            self._threads.append(thread)

    def _work(self) -> None:
        """A decode thread: pictures in turn until the pool closes."""
        while (turn := self._turns.take()) is not None:
            self._decode(*turn)
            del turn  # (nothing of a picture is held while idle)

    def _decode(self, submission: Submission, index: int, item) -> None:
        try:
            result, error = submission.fn(item), None
        except BaseException as e:  # handed to the caller, as an executor does
            result, error = None, e
        del item  # (the picture and the row it wrote let go before the loop hears of it)
        dropped = self._turns.ended(submission, failed=error is not None)
        submission.report(index, result, error, dropped)

    def _report(self, loop: asyncio.AbstractEventLoop, call: "_Call", index: int, result, error, dropped: int) -> None:
        try:
            loop.call_soon_threadsafe(self._ended, call, index, result, error, dropped)
        except RuntimeError:  # the loop closed first: nobody counts any more
            pass

    def _ended(self, call: "_Call", index: int, result, error: BaseException | None, dropped: int) -> None:
        """On the loop: an item decoded, or failed (`dropped`: the call's items not started then)."""
        self.pending -= 1 + dropped
        if error is None:
            call.results[index] = result
        else:
            call.errors.append((index, error))
        call.ended(1 + dropped)

    def _drop(self, call: "_Call", submission: Submission, unless_started: bool = False) -> int:
        dropped = self._turns.drop(submission, unless_started)
        self.pending -= dropped
        call.ended(dropped)
        return dropped

    def _wait_due(self, call: "_Call", submission: Submission, queued_ns: int, wait_s: float) -> None:
        """The call's deadline for a thread, by time.perf_counter_ns (the timer may fire early):
        its items are dropped unless one has been taken."""
        waited = time.perf_counter_ns() - queued_ns
        left = wait_s - waited / 1e9
        if left > 0:
            call.timer = asyncio.get_running_loop().call_later(max(left, TIMER_TICK_S), self._wait_due, call,
                                                               submission, queued_ns, wait_s)
            return
        call.timer = None
        if self._drop(call, submission, unless_started=True):
            call.timed_out_ns = waited

    def close(self) -> None:
        """Wait for running decodes, drop queued ones (their calls raise ShuttingDown). Safe twice."""
        self._closed = True
        for submission in self._turns.close():
            first = len(submission.items) - self._turns.drop(submission)
            for index in range(first, len(submission.items)):
                submission.report(index, None, ShuttingDown("server is shutting down"), 0)
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()


class _Call:
    """One map call's items on the loop: their outcomes, and how many are still waiting or
    decoding; calls `on_ended` once the call has queued all it will and none is."""

    __slots__ = ("results", "errors", "out", "done", "timer", "timed_out_ns", "_queuing", "_on_ended")

    def __init__(self, on_ended: Callable[[], None] | None):
        self.results: list = []
        self.errors: list[tuple[int, BaseException]] = []
        self.out = 0
        self.done: asyncio.Future | None = None
        self.timer = None  # the deadline's timer handle
        self.timed_out_ns = 0  # the wait when its deadline dropped its items
        self._queuing = True
        self._on_ended = on_ended

    def begin(self, n: int, done: asyncio.Future) -> None:
        self.results, self.out, self.done = [None] * n, n, done

    def ended(self, count: int) -> None:
        self.out -= count
        self._check()

    def queued_all(self) -> None:
        self._queuing = False
        self._check()

    def _check(self) -> None:
        if self.out:
            return
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        if not self._queuing and self._on_ended is not None:
            on_ended, self._on_ended = self._on_ended, None
            on_ended()
