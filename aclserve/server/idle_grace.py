"""The drain's idle connections, kept open GRACE_S before they close: a pooled client may have
written its next request on one at the instant the drain began, and a socket closed under it
left that client unable to tell whether its request ran (a POST infer cannot be retried blindly:
ServerDisconnectedError, ECONNRESET under a SIGTERM under load). Read meanwhile, such a request
is answered as any request on a connection open at the drain's start (connections.py: an infer
503 "server is shutting down", every answer with `Connection: close`), and the connection then
closes once its answer is out (unsent.py). One that sends nothing is sent, unasked, the 503 "server
is shutting down" (a failed device's drain: why) with `Connection: close` when the grace ends, and closed the
lingering way (lingering.py: a request its client writes at that instant reads it, where a bare close reset it),
as at the drain's end.

The drain waits for `over` (none left in the grace), which is at once when the drain begins
with no idle connection, and as soon as the last one is closed (by its client, a timeout) or
has its answer: an idle server's shutdown is not held. Loop thread only.
"""
from __future__ import annotations

import asyncio
from typing import Callable

# Long enough for a request already on its way (a round trip, a client's pool handing it the
# connection) and for a client under load, whose idle pooled connections are taken again within
# milliseconds; short, since a connection a client keeps idle for longer (a metrics scraper's)
# holds every shutdown that long. Never past the drain's deadline.
GRACE_S = 0.5


class IdleGrace:
    """Owned by the ConnectionTracker (connections.py), which hands each connection still in the
    grace at its end to `settle` (closed, or left to the answers still going out), and says when
    one leaves it before (`discard`: answered, closed)."""

    def __init__(self, settle: Callable[[object], None]):
        self._settle = settle
        self._conns: set = set()
        self._timer: asyncio.TimerHandle | None = None
        self.seconds = GRACE_S  # the grace given, once begun
        self.over = asyncio.Event()  # none left in the grace
        self.over.set()

    def __len__(self) -> int:
        return len(self._conns)

    def begin(self, conns: list, drain_s: float) -> None:
        """Keep `conns` open for GRACE_S, or the drain's `drain_s` when shorter (the drain's start)."""
        self.seconds = max(0.0, min(GRACE_S, drain_s))
        if not conns:
            return
        self._conns.update(conns)
        self.over.clear()
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self._ended)

    def discard(self, conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            if not self._conns:
                self.end()

    def _ended(self) -> None:
        self._timer = None
        conns, self._conns = self._conns, set()
        for conn in conns:
            self._settle(conn)
        self.over.set()

    def end(self) -> None:
        """None left, or the drain has ended (the tracker closed every connection)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._conns.clear()
        self.over.set()
