"""One connection as the connection tracker (connections.py) keeps it: its phase, since when, and
what it still owes its client. Loop thread only."""
from __future__ import annotations

import asyncio

from .send_deadline import SendClock

IDLE, HEAD, BUSY = "idle", "head", "busy"


class TrackedConnection:
    """Owned by the ConnectionTracker, which closes its transport; its guard (guard.py) and the tracker's
    helpers (spare_places.py, idle_clock.py) read and update it."""

    __slots__ = ("transport", "phase", "since", "hold", "stash", "forwarded", "unsent", "late", "closing", "clock",
                 "guard", "over", "probing", "tls")

    def __init__(self, transport, now: float, late: bool = False, guard=None, over: bool = False, tls: bool = False):
        self.transport, self.phase, self.since, self.tls = transport, IDLE, now, tls
        self.guard = guard  # its GuardedProtocol (guard.py), which knows whether a request is under way
        self.late = late  # opened during the drain: only GET and HEAD /metrics are answered on it
        self.over = over  # taken over max_connections: only a probe is answered on it (spare_places.py)
        self.probing = False  # that probe holds a spare place
        self.hold: asyncio.TimerHandle | None = None  # set while held after a refusal
        self.stash: list[bytes] = []  # bytes that arrived anyway while held
        self.forwarded = 0  # requests handed to aiohttp and not finished yet
        self.unsent = 0  # its write buffer at the last sweep that found answers pending
        self.closing = False  # an answer said `Connection: close`: nothing is answered after it (RFC 9112 9.6)
        self.clock: SendClock | None = None  # while its writing is paused: the send deadline's


def answers_pending(conn: TrackedConnection) -> bool:
    """Answers the client has not taken yet, or requests read and not answered yet."""
    return bool(conn.stash or conn.forwarded or conn.transport.get_write_buffer_size())
