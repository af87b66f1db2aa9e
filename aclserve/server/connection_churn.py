"""Heap left behind by closed connections, handed to HeapTrimmer (trim.py) once the server is quiet.

The budget charges request bodies and answers, never what a connection itself allocates, and over TLS
that is most of it: asyncio's and uvloop's TLS transports each malloc a 256 KiB read buffer per connection
(asyncio another 256 KiB object per read), OpenSSL its session and record buffers besides. glibc's mmap
threshold has risen by then (after its first large free), so these come from the heap, and once freed their
pages stay there, pinned by the small objects allocated among them (measured, 32-row JSON infers of 41 KB,
one connection each: RSS 102 -> 118 MB after 100 TLS connections, 152 after 300, 159 after 1,500, and a
`malloc_trim(0)` later gave back 41 MB; 1,500 over plain HTTP: +1 MB). No trim ever came: none of this
reached the budget's thresholds.

So the tracker counts each connection it lets go (one increment; the figures are applied only at its sweep)
and, once the closed ones are estimated to have freed CHURN_TRIM_BYTES, its sweep hands that to the
trimmer when the server has gone quiet: no connection closed for a whole sweep period (up to 1 s), none with
a request under way (or a head or a TLS handshake coming), no byte charged to the budget. A trim walks
every arena (milliseconds), so it never comes at each connection, nor while a churn goes on: a steady
churn stays at its plateau (bounded) until it pauses. The trimmer's own rules hold: one at a time, at most
once per min_interval_s, in a worker thread, nothing elsewhere than glibc. Loop thread only.
"""
from __future__ import annotations

from typing import Callable

from .trim import TRIM_AFTER_BYTES, HeapTrimmer

# What a closed connection is taken to have freed into the heap: a TLS one its 256 KiB read buffer alone
# (OpenSSL's state and asyncio's reads left uncounted: most of what stays comes from the first few hundred
# connections, so a trim after a few dozen is the one worth having); a plain one little (aiohttp's handler
# and parser, most of it reused: +1 MB over 1,500), counted so that a long churn is trimmed too, rarely.
TLS_CLOSE_BYTES = 256 * 1024
PLAIN_CLOSE_BYTES = 8 * 1024
# The trim comes once the estimate reaches this: 32 TLS connections, or 1,024 plain ones (as after a request
# that held as much: trim.TRIM_AFTER_BYTES).
CHURN_TRIM_BYTES = TRIM_AFTER_BYTES


class ConnectionChurn:
    """Owned by the connection tracker, which counts in `closed` and calls `swept` at each sweep; it trims
    through the server's HeapTrimmer (None: counts only, never trims). `in_flight()`: bytes the budget
    holds now."""

    def __init__(self, trimmer: HeapTrimmer | None = None, in_flight: Callable[[], int] = lambda: 0):
        self.closed = [0, 0]  # connections closed since the last trim handed over: [plain, TLS]
        self._trimmer = trimmer
        self._in_flight = in_flight
        self._seen = 0  # how many had closed at the last sweep

    def estimate(self) -> int:
        """The heap the connections closed since the last trim are estimated to have freed."""
        return self.closed[0] * PLAIN_CLOSE_BYTES + self.closed[1] * TLS_CLOSE_BYTES

    def swept(self, under_way: Callable[[], bool]) -> bool:
        """At the tracker's sweep; `under_way()`: whether a connection has a request (or its head, or a TLS
        handshake) under way. Hands the estimate to the trimmer once it has reached CHURN_TRIM_BYTES and the
        server is quiet (module docstring). True while one is owed and not yet handed over: the sweeps go on,
        though no connection is left."""
        if self._trimmer is None or self.estimate() < CHURN_TRIM_BYTES:
            return False
        before, self._seen = self._seen, sum(self.closed)
        if before != self._seen or under_way() or self._in_flight():
            return True
        self._trimmer.freed(self.estimate())
        self.closed[:], self._seen = [0, 0], 0
        return False
