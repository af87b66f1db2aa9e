"""HTTP request bodies still arriving, and ending the stalled ones when another request is
refused for the memory they hold.

A body is charged as its bytes arrive (body.py), so a client that stops sending keeps what it
sent charged until body_timeout_s (60 s) ends it with 408: a few clients that send most of a
large body and stop could hold the memory budget for a minute. So when another request is
refused for want of request memory (a 503 of the budget, or of its model's share of it, either
transport: budget.py calls `make_room`), the bodies that have received nothing for STALL_S or
more are ended at once, the one that began first first (for a share's refusal, that model's
first), as far as what they hold makes room for that request in the budget and in its share
(none when all of them together would not): each is answered 408 and its connection closed,
and the refused client's retry (its Retry-After) finds the memory. As gRPC ends the message
read that has taken longest while other calls wait for a place (grpc_arrivals.py). Not ended
here: a body still arriving, however slowly (it holds only what it has sent, and body_timeout_s
bounds it), and none for a request refused while its own body arrives (it is one of them).
Loop thread only.
"""
from __future__ import annotations

import time

from .budget import Lease
from .deadline_wait import expire_now

STALL_S = 1.0  # a body that has received nothing for this long may be ended for another request


class Arrival:
    """One body's read: its lease, when bytes last came (`came()`), and the timeout_at deadline
    it is read under, which `end()` moves to now. A context manager: watched by its
    StalledBodies (if any) while in it."""

    __slots__ = ("lease", "last", "deadline", "ended", "_bodies")

    def __init__(self, bodies: StalledBodies | None, lease: Lease, deadline):
        self.lease = lease
        self.deadline = deadline
        self.last = time.monotonic()
        self.ended = False
        self._bodies = bodies

    def came(self) -> None:
        """Bytes of the body came."""
        self.last = time.monotonic()

    def end(self) -> None:
        """End the read now: it raises TimeoutError where it waits (body.read_body: 408)."""
        self.ended = True
        expire_now(self.deadline)

    def __enter__(self) -> Arrival:
        if self._bodies is not None:
            self._bodies._arriving[self.lease] = self
        return self

    def __exit__(self, *exc) -> None:
        if self._bodies is not None:
            self._bodies._arriving.pop(self.lease, None)


class StalledBodies:
    """Owned by the server state; the HTTP body reads register here (body.read_body), the
    budget calls `make_room` when it refuses a request for want of memory."""

    def __init__(self):
        self._arriving: dict[Lease, Arrival] = {}  # by the lease charged for it, oldest first
        self.ended = 0  # bodies ended for others (/metrics; counted by the read that ends)

    def make_room(self, refused: Lease, short: int, model: str | None = None, share_short: int = 0) -> None:
        """`refused` could not be charged for want of room: `short` bytes more held by others
        would have made it fit in the budget (0 or less: it fits there), and, refused by
        `model`'s share, `share_short` bytes more held by that model's requests in that share.
        End the bodies stalled for STALL_S or more, those that began first first, until what they
        hold (with that of the ones ended before and not yet gone) makes room in both: that
        model's first (their bytes count in both), then, for what the budget still lacks, the
        others' (a retry that found room in its share and none in the budget was refused again);
        none when they cannot. Their reads raise when the loop next runs them; the memory comes
        back then."""
        if refused in self._arriving:
            return  # a body refused while it arrives: one of those that would be ended
        stalled_since = time.monotonic() - STALL_S
        chosen = []
        for arrival in self._stalled(stalled_since, lambda lease: model is None or lease.model == model):
            if short <= 0 and share_short <= 0:
                break
            short -= arrival.lease.held
            share_short -= arrival.lease.held
            chosen.append(arrival)
        if share_short > 0:
            return  # ending them would not make room in the share: the refusal stands alone
        if model is not None:  # the rest of the budget's shortfall: the other models' bodies
            for arrival in self._stalled(stalled_since, lambda lease: lease.model != model):
                if short <= 0:
                    break
                short -= arrival.lease.held
                chosen.append(arrival)
        if short > 0:
            return  # nor in the budget
        for arrival in chosen:
            if not arrival.ended:
                arrival.end()

    def _stalled(self, since: float, belongs):
        """The arrivals whose lease `belongs`, stalled since `since` or ended already (not yet
        gone: what they hold is coming back), in the order they began."""
        for arrival in self._arriving.values():
            if belongs(arrival.lease) and (arrival.ended or arrival.last <= since):
                yield arrival
