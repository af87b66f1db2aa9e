"""Connections closed the lingering way after a last answer the server writes unasked: a 503 whose
request is not read (connections.py: a new connection at max_connections or once the drain has
ended, and, when the drain or an idle connection's grace ends, each connection with no request
under way).

Closed right after that answer, a connection met the request its client wrote at that instant
with a reset, which could reach the client before it read the answer (ECONNRESET,
ServerDisconnectedError: a POST infer it could not know had not run). So the sending side is shut
(write_eof: the client reads the answer, then the end), what the client still sends is read and
dropped (its guard, guard.py, forwards nothing more), and the connection closes once its client
closes it, or after LINGER_S (sooner at the shutdown's deadline: `closed_by`). Loop thread only.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from .descriptors import lingering_cap

LINGER_S = 1.0  # a round trip and a client's read of the answer, on a slow link
# How often the shutdown looks for connections their clients closed (asyncio says a transport has
# closed only to its protocol)
CHECK_S = 0.05


class Lingering:
    """Owned by the ConnectionTracker (connections.py). The process's exit would cut these closes
    short (a socket closed with what its client sent unread resets it): the shutdown waits for
    them, no later than its deadline (`closed_by`)."""

    def __init__(self, sharing: Callable[[], int] = lambda: 0):
        self._timers: dict[object, asyncio.TimerHandle] = {}  # transport -> its close
        self._capped: set = set()  # those refused before they counted as connections
        # the descriptors of lingering_cap() taken otherwise: connections over max_connections (spare_places.py)
        self._sharing = sharing

    def __len__(self) -> int:
        return len(self._timers)

    def close(self, transport, answer: bytes, deadline: float | None = None, capped: bool = True) -> None:
        """Write `answer` on `transport`, then close it the lingering way, for LINGER_S at most, and
        until `deadline` (time.monotonic()) at most. At once when that has passed, or when `capped` (a
        connection refused before it counted against max_connections) and descriptors.lingering_cap()
        such connections linger already (with those taken over max_connections)."""
        transport.write(answer)
        seconds = LINGER_S if deadline is None else min(LINGER_S, deadline - time.monotonic())
        if seconds <= 0 or (capped and len(self._capped) + self._sharing() >= lingering_cap()):
            transport.close()
            return
        if capped:
            self._capped.add(transport)
        if transport.can_write_eof():  # (TLS cannot: its close_notify goes with the close)
            transport.write_eof()
        transport.resume_reading()  # (a connection held after an overload refusal was not read)
        self._timers[transport] = asyncio.get_running_loop().call_later(seconds, self._close, transport)

    def _close(self, transport) -> None:
        self._timers.pop(transport).cancel()
        self._capped.discard(transport)
        transport.close()

    async def closed_by(self, deadline: float) -> None:
        """Wait until every lingering connection has closed (its client closed it, or its time
        ran out), or until `deadline` (time.monotonic()), then close those left. At once when
        none lingers."""
        while self._timers and time.monotonic() < deadline:
            await asyncio.sleep(min(CHECK_S, max(0.0, deadline - time.monotonic())))
            for transport in [transport for transport in self._timers if transport.is_closing()]:
                self._close(transport)
        for transport in list(self._timers):
            self._close(transport)
