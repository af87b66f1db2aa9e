"""DecodePool: the bounded worker pool where images decode, off the event loop.

Owned by the server state (one per server, shared by every model) and closed at shutdown. At
most `max_pending` images are queued or decoding at once, counted until their thread finishes
(also when the request that sent them was cancelled); a request that would pass the bound gets
QueueFull (503) at once rather than holding its body in memory while it waits. workers = 0
decodes on the calling (event loop) thread: only for measuring what the pool buys.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from typing import Callable, Sequence

from ..errors import Overloaded, PayloadTooLarge, QueueFull, ShuttingDown

log = logging.getLogger(__name__)


class DecodePool:
    def __init__(self, workers: int, max_pending: int):
        self.workers = workers
        self.max_pending = max_pending
        self.pending = 0  # event-loop thread only
        self._closed = False
        self._executor = (concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="aclserve-decode")
                          if workers else None)

    async def map(self, fn: Callable, items: Sequence, on_ended: Callable[[], None] | None = None) -> list:
        """[fn(item) for item in items], each item a separate job, in the pool's threads.
        Raises the first job's exception (by item order) after all jobs finished. `on_ended`
        is called on the loop once every job has ended (run, failed, or dropped before it
        began), or at once when none was submitted: also when the caller was cancelled
        meanwhile, whose jobs already running run on."""
        ended = _Countdown(on_ended)
        try:
            return await self._map(fn, items, ended)
        finally:
            ended.submitted_all()

    async def _map(self, fn: Callable, items: Sequence, ended: "_Countdown") -> list:
        if self._closed:
            raise ShuttingDown("server is shutting down")
        if self._executor is None:
            return [fn(item) for item in items]
        n = len(items)
        if n > self.max_pending:  # never fits, however long its client waits: not a retry-later
            raise PayloadTooLarge(f"the request holds {n} images, more than are decoded at once "
                                  f"({self.max_pending}: images.max_pending); send fewer per request")
        if self.pending + n > self.max_pending:
            raise QueueFull(f"image decoding is saturated ({self.pending} images pending, limit "
                            f"{self.max_pending}: images.max_pending); retry later")
        loop = asyncio.get_running_loop()
        self.pending += n
        futures = []
        job = None
        try:
            for item in items:
                job = _Job(fn, item)
                cf = self._executor.submit(job)
                cf.add_done_callback(functools.partial(self._job_ended, loop, ended, job))
                ended.began()
                futures.append(asyncio.wrap_future(cf, loop=loop))
        except RuntimeError as e:  # shut down while submitting, or a thread that cannot start
            for _ in range(n - len(futures)):
                self.pending -= 1
            if job is not None:  # queued by the submit that failed: it runs later, as nothing
                job.drop()
            if self._closed:
                raise
            # ("can't start new thread": the process's limit)
            raise Overloaded(f"image decoding cannot start a thread ({e}); retry later") from None
        done = await asyncio.gather(*futures, return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result
        return done

    def _job_ended(self, loop: asyncio.AbstractEventLoop, ended: "_Countdown", job: "_Job", cf) -> None:
        """A job's future is done (a thread's, or the loop's when it was cancelled before it began:
        its item, the tensor row it was to write included, is let go now, not when a thread takes
        the cancelled job off the executor's queue, after the jobs queued before it)."""
        if cf.cancelled():
            job.drop()
        try:
            loop.call_soon_threadsafe(self._release, ended)
        except RuntimeError:  # the loop closed first: nobody counts any more
            pass

    def _release(self, ended: "_Countdown") -> None:
        self.pending -= 1
        ended.one_ended()

    def close(self) -> None:
        """Wait for running decodes, drop queued ones. Safe twice."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


class _Countdown:
    """One map call's jobs still running; calls `on_ended` (loop thread) once the call has
    submitted all it will and every job it submitted has ended."""

    __slots__ = ("_running", "_submitting", "_on_ended")

    def __init__(self, on_ended: Callable[[], None] | None):
        self._running = 0
        self._submitting = True
        self._on_ended = on_ended

    def began(self) -> None:
        self._running += 1

    def one_ended(self) -> None:
        self._running -= 1
        self._check()

    def submitted_all(self) -> None:
        self._submitting = False
        self._check()

    def _check(self) -> None:
        if not self._submitting and self._running == 0 and self._on_ended is not None:
            on_ended, self._on_ended = self._on_ended, None
            on_ended()


class _Job:
    """One item's decode as the executor runs it; dropped (its image let go) when the submit
    that queued it failed (nobody waits for it, and with no thread ever started it stayed
    queued) or when it was cancelled before it began."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: Callable, item):
        self.fn, self.item = fn, item

    def __call__(self):
        fn, item = self.fn, self.item
        return None if fn is None else fn(item)

    def drop(self) -> None:
        self.fn = self.item = None
