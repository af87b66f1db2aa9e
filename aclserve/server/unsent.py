"""The drain's connections still sending answers: a slow reader of a large answer (its
transport's buffer not empty) when the drain began, or one whose request ended during it. Each
is closed once its answers are out, and the drain waits for `sent` as it waits for requests in
flight; when the drain ends, the connection tracker closes what is left. Loop thread only."""
from __future__ import annotations

import asyncio
from typing import Callable

# How often they are looked at: asyncio tells a protocol its buffer has drained only below the
# low-water mark, not when it is empty
CHECK_S = 0.05


class UnsentAnswers:
    """Owned by the ConnectionTracker (connections.py), which says whether a connection is still
    open (`is_open`), whether it has answers pending or a request running (`pending`), and closes
    it (`close`, which calls `discard`)."""

    def __init__(self, is_open: Callable[[object], bool], pending: Callable[[object], bool],
                 close: Callable[[object], None]):
        self._is_open, self._pending, self._close = is_open, pending, close
        self._conns: set = set()
        self._check: asyncio.TimerHandle | None = None
        self.sent = asyncio.Event()  # none left
        self.sent.set()

    def __len__(self) -> int:
        return len(self._conns)

    def add(self, conn) -> None:
        self._conns.add(conn)
        self.sent.clear()
        if self._check is None:
            self._check = asyncio.get_running_loop().call_later(CHECK_S, self._close_sent)

    def discard(self, conn) -> None:
        self._conns.discard(conn)

    def _close_sent(self) -> None:
        self._check = None
        for conn in list(self._conns):
            if not self._is_open(conn):  # closed meanwhile (by its client, a timeout)
                self._conns.discard(conn)
            elif not self._pending(conn):
                self._close(conn)
        if self._conns:
            self._check = asyncio.get_running_loop().call_later(CHECK_S, self._close_sent)
        else:
            self.sent.set()

    def end(self) -> None:
        """The drain has ended (the tracker closed every connection): nothing is waited for."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        self._conns.clear()
        self.sent.set()
