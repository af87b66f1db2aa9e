"""Give freed heap memory back to the system after large requests (heap.trim: malloc_trim).

glibc keeps freed memory in its arenas, and after a large free it raises its mmap threshold,
so later large bodies come from the heap too: a burst of big requests would leave the RSS at
its peak for good. After requests that held at least TRIM_AFTER_BYTES finish, and once requests
in flight that held at least BURST_BYTES together have mostly gone (3,000 uploads of 100 KB left
the RSS 300 MB up for good), `malloc_trim(0)` returns the free pages; it runs in a worker thread
(it walks every arena), at most once per `min_interval_s`, and never twice at once. Steady load
holds less than BURST_BYTES and triggers none. The connection tracker hands it, once the server
has gone quiet, what closed connections churned (connection_churn.py: TLS's buffers, never charged).
Elsewhere than glibc this does nothing.
"""
from __future__ import annotations

import asyncio
import logging
import time

from .. import heap

log = logging.getLogger(__name__)

TRIM_AFTER_BYTES = 8 * 1024 * 1024
BURST_BYTES = 64 * 1024 * 1024


class HeapTrimmer:
    """Owned by the server state; `released(nbytes)` is called on the loop when a request ends."""

    def __init__(self, min_interval_s: float = 1.0):
        self.min_interval_s = min_interval_s
        self.freed_since = 0  # bytes released by large requests (or a burst) since the last trim
        self._high = 0  # the most the requests in flight held together since the last burst's trim
        self.trims = 0
        self._last = 0.0
        self._task: asyncio.Future | None = None
        self._later: asyncio.TimerHandle | None = None

    @property
    def available(self) -> bool:
        return heap.available()

    def released(self, nbytes: int, in_use: int = 0) -> None:
        """A request that held `nbytes` ended; requests in flight still hold `in_use`."""
        self._high = max(self._high, in_use + nbytes)
        if self._high >= BURST_BYTES and in_use <= self._high // 4:
            nbytes, self._high = max(nbytes, self._high - in_use), in_use  # the burst has mostly gone
        if nbytes >= TRIM_AFTER_BYTES:
            self.freed(nbytes)

    def freed(self, nbytes: int) -> None:
        """About `nbytes` were freed that the budget never charged (connection_churn.py): a trim soon."""
        if heap.available():
            self.freed_since += nbytes
            self._schedule()

    def _schedule(self) -> None:
        if self._later is not None or (self._task is not None and not self._task.done()):
            return  # one trim at a time; the one running or due covers these bytes too
        loop = asyncio.get_running_loop()
        wait = self._last + self.min_interval_s - time.monotonic()
        if wait > 0:
            self._later = loop.call_later(wait, self._start)
        else:
            self._start()

    def _start(self) -> None:
        self._later = None
        if not self.freed_since:
            return
        self.freed_since = 0
        self._last = time.monotonic()
        self._task = asyncio.get_running_loop().run_in_executor(None, heap.trim)
        self._task.add_done_callback(self._done)

    def _done(self, future: asyncio.Future) -> None:
        self.trims += 1
        if not future.cancelled() and future.exception() is not None:
            log.warning("malloc_trim failed: %s", future.exception())
        if self.freed_since:
            self._schedule()

    def close(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
