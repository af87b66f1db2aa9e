"""Spare places beyond max_connections for the health probes and /metrics, and the warning that
connections are refused at the cap.

At max_connections with no connection idle long enough to give way (connections.py), a new one was
answered 503 before its request was read, probes and scrapes alike: a kubelet whose liveness probe
fails so restarts a pod for being busy, and the scrape that would show why is lost (a tester, t87:
40 busy clients over a cap of 12, `/v2/health/live`, `/v2/health/ready` and `/metrics` all 503,
and no log line said so). Such a connection is now taken over the cap and its request read: GET
and HEAD of PROBE_PATHS take one of SPARE_PLACES spare places and are answered, anything else gets
the 503 it got before, and either answer closes the connection (tracking.py, as during the drain).
The connection guard (guard.py) decides as the request head comes, before aiohttp sees it, and
makes aiohttp's handler for a probe alone: with a handler made for each connection, a refusal cost
the loop about 160 us against 60 before; so, about 85 us (4,000 refused connections in a row, the
CPU time of `aclserve serve`).

Places are not given at the accept: the clients refused at the cap reconnect at once, and one
accept takes many of them, which then held every spare place (16 spare places, 28 such clients:
half the probes refused). As many connections are taken over the cap as refusals may linger
(descriptors.lingering_cap), whose descriptors they share (lingering.py: a refusal beyond them is
closed at once, as before); one idle (or in its head) for EVICT_AFTER_S gives way to a new one as
in the cap; with none free a new connection is refused as before. Over TLS none is taken over the
cap (closed at once, as before): reading its request would cost the loop a TLS handshake for each
client refused, at the moment the server has no room. Loop thread only.
"""
from __future__ import annotations

import logging

from .descriptors import lingering_cap

log = logging.getLogger(__name__)

# Probes answered over the cap at once. A pod's three probes (startup, liveness, readiness) and a
# scraper or two need five; 16 leaves room for a few more scrapers and a probe retried on timeout,
# while a flood of them costs the loop no more than 16 answers at a time.
SPARE_PLACES = 16
PROBE_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})
_PROBE_TARGETS = frozenset(path.encode() for path in PROBE_PATHS)
WARN_EVERY_S = 60.0  # while connections are refused: a WARNING at most this often


def probe_head(head) -> bool:
    """What a spare place answers, read from a request head (request_head.Head): GET and HEAD of PROBE_PATHS."""
    return head.method in (b"GET", b"HEAD") and head.target.partition(b"?")[0] in _PROBE_TARGETS


class SpareRoom:
    """Owned by the ConnectionTracker: the connections open over max_connections (`over`), those of
    them whose probe holds a spare place (`probing`); and a WARNING when connections are first refused
    at the cap, then one a minute at most while they still are, with how many (before, refusals left
    no log line, however long they lasted; aclserve_connections_closed_total{reason="refused"} counts
    them all)."""

    def __init__(self) -> None:
        self.over = 0
        self.probing = 0
        self._said: float | None = None  # when the last WARNING was written (the loop's clock)
        self._refused = 0  # refusals since then

    def room(self) -> int:
        """Connections that may still be taken over the cap: the descriptors kept for refusals lingering, which
        the refused ones then leave to these (lingering.py: a refusal over that closes at once, as before)."""
        return lingering_cap() - self.over

    def take(self, conn, probe: bool) -> bool:
        """Whether the request on `conn` (tracked_connection.TrackedConnection, over the cap) is answered: a
        probe, a spare place free (it takes it, until the connection closes)."""
        if probe and not conn.probing and self.probing < SPARE_PLACES:
            conn.probing = True
            self.probing += 1
        return probe and conn.probing

    def left(self, conn) -> None:
        self.over -= conn.over
        self.probing -= conn.probing

    def refused(self, now: float, max_connections: int) -> None:
        self._refused += 1
        if self._said is not None and now - self._said < WARN_EVERY_S:
            return
        count = (f"{self._refused} refused in the {now - self._said:.0f} s since the last such line"
                 if self._said is not None else "the first refused")
        log.warning("HTTP connections refused at max_connections (%d taken, none idle long enough to give way; "
                    "%d spare places over it answer health probes and /metrics alone): %s (raise "
                    "max_connections or add replicas; said once a minute at most while it lasts)",
                    max_connections, SPARE_PLACES, count)
        self._said, self._refused = now, 0
