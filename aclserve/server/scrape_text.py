"""The text /metrics answers: one taking of it shared by the scrapes that come while it runs, its
figures copied on the event loop in steps (scrape.py) and written in a worker thread that gives
the GIL back as it goes.

At 1,000 versions a scrape is ~11 MB of text (141 k lines), ~110 ms of a worker thread writing it
(exposition.py). Written in one go, that thread held the GIL but for the interpreter's switch
interval (5 ms): each time the loop let go of it (a socket read or write, a wait) the writer took it
and the loop waited out the interval to have it back, for every request. It now gives the GIL back
every exposition.CHUNK_LINES lines (`time.sleep`: a wait, which another thread wanting the GIL
takes; the loop waits for the rest of a chunk at most). Two scrapes at once (Prometheus servers in
pairs, a scraper and a person) each copied and wrote everything; the second now waits for the one
running and answers its text, taken a moment before it came (less than one scrape's time), each
coding compressed once (Prometheus asks gzip).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from aiohttp.web import ContentCoding

from .answer_coding import encoded
from .exposition import render
from .metrics import ServerMetrics

log = logging.getLogger(__name__)

# the writer's wait between two chunks: long enough for a thread waiting on the GIL to take it
# (time.sleep(0) lets go of it and most often takes it back first) and run a while; ~140 of them at
# 1,000 versions add ~35 ms to the scrape's time, none to its CPU
GIL_PAUSE_S = 0.0002


class ScrapeText:
    """Owned by the server's state: `text()` is the text of a scrape taken now or, while one is
    taken, of that one. `refresh()` re-reads the figures that need a blocking call (device
    memory), in a worker thread first. The taking is a task of its own, so a scrape whose client
    leaves (its handler cancelled) does not cancel the others' waiting on it; `close()` ends one
    still running (the app's cleanup)."""

    def __init__(self, metrics: ServerMetrics, refresh: Callable[[], None]):
        self._metrics, self._refresh = metrics, refresh
        self._running: asyncio.Task | None = None

    async def text(self) -> "Text":
        task = self._running
        if task is None:
            task = self._running = asyncio.get_running_loop().create_task(self._take(), name="metrics scrape")
            task.add_done_callback(self._taken)
        return await asyncio.shield(task)

    def close(self) -> None:
        """Cancel a taking still running (its worker thread's part runs on to its end, unused)."""
        if self._running is not None:
            self._running.cancel()

    def _taken(self, task: asyncio.Task) -> None:
        if self._running is task:
            self._running = None
        if not task.cancelled():
            task.exception()  # (its waiters answer it; none left, it is not "never retrieved")

    async def _take(self) -> "Text":
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._refresh)
        snapshot = await self._metrics.snapshot_in_steps()
        return Text(await loop.run_in_executor(None, render, snapshot.families, _give_gil_back))


def _give_gil_back() -> None:
    time.sleep(GIL_PAUSE_S)


class Text:
    """A scrape's text (`body`) and, once asked, its compressed forms, each made once (worker threads)."""

    def __init__(self, body: bytes):
        self.body = body
        self._coded: dict[ContentCoding, bytes] = {}
        self._lock = threading.Lock()  # (two scrapes asking gzip at once: one compresses, the other waits)

    def coded(self, coding: ContentCoding) -> bytes:
        """The body in `coding` (blocking: a worker thread's)."""
        with self._lock:
            body = self._coded.get(coding)
            if body is None:
                body = self._coded[coding] = encoded(self.body, coding)
            return body
