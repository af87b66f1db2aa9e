"""Open connections: capped, timed, and closed at shutdown.

aiohttp has no connection cap and no request-head timeout, so the listening socket hands each
connection to a GuardedProtocol (guard.py), a thin asyncio protocol in front of aiohttp's own,
which reports to the ConnectionTracker here. The tracker knows each connection's phase (tracked_connection.py):

    IDLE  no request in progress (new, or answered and kept alive)   -> keepalive_timeout_s
    HEAD  bytes of a request head arrived, no handler yet            -> header_timeout_s
    BUSY  a handler runs (body reads have their own body_timeout_s)  -> no limit here

An IDLE connection whose client has not taken its answers, or whose pipelined requests wait to be
read, is not idle: it is closed after `send_timeout_s` (body_timeout_s) without progress instead, as
nginx's send_timeout does; over the buffer's high-water mark, in any phase, its client must take it at
`send_min_bytes_per_s` once `send_timeout_s` has passed (send_deadline.py). Either closes it dropping
what its client has not taken (a close waits to send it, outside the cap).

A sweep every second closes connections past their phase's limit. At the cap (`max_connections`, less what
kept model files take: descriptor_shares.py) a new one replaces the one idle longest (or the slowest head) if so
for EVICT_AFTER_S or more, else is taken over it (below), else gets a 503 and closed. At shutdown the connections
doing nothing get a short grace (idle_grace.py), then, like every one still open with no request under way when
the drain ends (close_all), the 503 "server is shutting down" (a failed device's drain: why, the state's
stopping_message) unasked and a lingering close (lingering.py: a request its client writes then reads that 503,
where a bare close reset it); the others close once their `Connection: close` answers are out (unsent.py), or
when the drain ends, dropping what their client has not taken.
One opened during the drain is admitted for `GET` and `HEAD /metrics` alone (tracking.py); once the drain has
ended, new ones are refused with that 503 before their request is read. Loop thread only.

Over the cap only a health probe or scrape is answered, in a spare place (spare_places.py). A sweep that runs late
does not count the time the loop did not run, nor closes as idle a connection with a request unread (idle_clock.py).
Overload refusals are answered early by the guard (guard.py, shedding.py); holds: holds.py.
The heap that closed connections left is trimmed once the server is quiet (connection_churn.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ..descriptor_shares import http_shrink
from .connection_churn import ConnectionChurn
from .holds import hold_seconds
from .idle_clock import discount, stalled, unread_bytes
from .idle_grace import IdleGrace
from .lingering import Lingering
from .open_calls import SHUTDOWN_MESSAGE
from .outbox import Outbox
from .send_deadline import SendClock, reset_on_close
from .shedding import refusal
from .spare_places import SpareRoom
from .tracked_connection import BUSY, HEAD, IDLE, TrackedConnection, answers_pending
from .unsent import UnsentAnswers

log = logging.getLogger(__name__)

EVICT_AFTER_S = 1.0  # a connection idle (or in its head) this long may make room for a new one
# An answer sent before its request's body has all arrived (a refusal): aiohttp reads and drops the
# rest for at most this long (its lingering_time; nginx's is 30 s), since closing with bytes unread resets
# the connection before its client sees the answer; the sweep's header_timeout_s bounds it too.
BODY_LINGER_S = 10.0

_FULL = refusal("server has too many open connections (max_connections); retry later", 1, close=True)


class ConnectionTracker:
    """Owned by the server state; each connection's GuardedProtocol (guard.py) reports to it."""

    def __init__(self, max_connections: int, header_timeout_s: float, keepalive_timeout_s: float,
                 hold_refused: bool = False, send_timeout_s: float = 60.0, send_min_bytes_per_s: int = 0):
        self.max_connections, self.hold_refused = max_connections, hold_refused
        self.header_timeout_s, self.keepalive_timeout_s = header_timeout_s, keepalive_timeout_s
        self.send_timeout_s = max(send_timeout_s, keepalive_timeout_s)
        self.send_min_bytes_per_s = send_min_bytes_per_s  # 0: no send deadline
        self.accepting = True
        self.closed = False  # the drain has ended (close_all): every new connection is refused
        self.counts = {"refused": 0, "evicted": 0, "header_timeout": 0, "idle_timeout": 0, "slow_reader": 0}
        self.early = None  # shedding.EarlyRefusal: infer requests refused before aiohttp sees them
        self.direct = None  # direct.DirectInfer: plain infer requests answered without aiohttp
        # () -> what the drain's refusals say: the state's stopping_message (a failed device: why), set by the state
        self.stopping_message: Callable[[], str] = lambda: SHUTDOWN_MESSAGE
        self.churn = ConnectionChurn()  # the closed ones' heap, trimmed once quiet (state.py gives it the trimmer)
        self.outbox = Outbox()  # the guard's early refusals, written together at the end of a round
        self.held = 0  # connections held now
        self.holds = 0  # holds since start
        self.tls_refused = 0  # TLS handshakes refused (no or a bad client certificate, an old protocol)
        self._conns: dict[object, TrackedConnection] = {}
        self.spare = SpareRoom()  # those over max_connections
        self.lingering = Lingering(lambda: self.spare.over)  # refused ones, those answered 503 at the drain's end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # during the drain: connections closed once their answers are out (sending.sent: none left)
        self.sending = UnsentAnswers(lambda conn: self._conns.get(conn.transport) is conn,
                                    lambda conn: conn.phase == BUSY or answers_pending(conn), self._close)
        self.idle = IdleGrace(self._after_grace)  # during the drain: the connections idle at its start
        self._deadline = float("inf")  # the drain's deadline (time.monotonic()), once it has begun
        self._period = max(0.05, min(1.0, header_timeout_s / 4, keepalive_timeout_s / 4))

    def __len__(self) -> int:
        return len(self._conns)

    @property
    def handshake_timeout_s(self) -> float:
        """asyncio's TLS handshake bound: past the sweep's, which closes it first, counting a header timeout."""
        return self.header_timeout_s + 2 * self._period

    def now(self) -> float:
        return self._loop.time()

    def closing_answer(self) -> bytes:
        """The 503 a connection gets once the drain has ended, or unasked at the end of its grace or of the drain
        (tracking.py answers one opened during the drain alike): `Retry-After: 1`, `Connection: close`."""
        return refusal(self.stopping_message(), 1, close=True)

    # -- admission ------------------------------------------------------------------------------
    def admit(self, transport, plain: bool = True, guard=None) -> TrackedConnection | None:
        """Track a new connection (`guard`: its GuardedProtocol), or refuse it: with a 503 when it speaks
        plain HTTP, closed at once when its TLS has not started (an answer in the clear is noise to its
        client)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        if self.closed:
            self._refuse(transport, self.closing_answer() if plain else None)
            return None
        over = self._place(now, plain) if len(self._conns) >= self.cap() else False
        if over is None:
            self.refused_at_cap()
            self._refuse(transport, _FULL if plain else None)
            return None
        conn = TrackedConnection(transport, now, not self.accepting, guard, over, tls=not plain)
        self._conns[transport] = conn
        self.spare.over += over
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self._period, self._sweep)
        return conn

    def cap(self) -> int:
        """Connections admitted at most now: max_connections, less what the model files loaded
        versions keep open past their room take from it (descriptor_shares.py)."""
        return max(1, self.max_connections - http_shrink())

    def _place(self, now: float, plain: bool) -> bool | None:
        """At the cap: False when a place in it is free or made free (module docstring), True: one over it (plain HTTP
        alone: spare_places.py); else None."""
        victims = None
        for over, free in ((False, self.cap() - (len(self._conns) - self.spare.over)),
                           (True, self.spare.room()))[:2 if plain else 1]:
            if free > 0:
                return over
            victims = victims or self._evictable(now)
            if victims[over] is not None:
                self.counts["evicted"] += 1
                self._close(victims[over])
                return over
        return None

    def _evictable(self, now: float) -> tuple[TrackedConnection | None, TrackedConnection | None]:
        """The connection that may give way of those in the cap, and of those over it."""
        best: list = [None, None]
        for conn in self._conns.values():
            if conn.phase != BUSY and now - conn.since >= EVICT_AFTER_S and not answers_pending(conn):
                rank = (conn.phase == HEAD, conn.since)  # idle ones first, oldest first
                if best[conn.over] is None or rank < best[conn.over][0]:
                    best[conn.over] = (rank, conn)
        return tuple(found and found[1] for found in best)

    def refused_at_cap(self) -> None:
        """Refused at the cap, as it came or (over it) as its request came: counted, said once a minute at most."""
        self.counts["refused"] += 1
        self.spare.refused(self._loop.time(), self.cap())

    def refuse_over(self, conn: TrackedConnection) -> None:
        """Over the cap, `conn`'s request has no spare place (its guard saw it): the cap's 503, closed lingering."""
        self.refused_at_cap()
        self._untrack(conn)
        self.lingering.close(conn.transport, _FULL)

    def _refuse(self, transport, answer: bytes | None) -> None:
        if answer is None:
            transport.close()
        else:
            self.lingering.close(transport, answer)

    def secured(self, conn: TrackedConnection, transport) -> bool:
        """`conn`'s TLS handshake is done: it goes on over `transport` (TLS's), idle. False
        when it was closed meanwhile."""
        if self._conns.pop(conn.transport, None) is None:
            return False
        conn.transport = transport
        conn.phase, conn.since = IDLE, self._loop.time()
        self._conns[transport] = conn
        return True

    def forget(self, conn: TrackedConnection | None) -> None:
        if conn is not None:
            self._untrack(conn)

    # -- overload holds ---------------------------------------------------------------------------
    def refused_for_room(self, transport, body_pending: bool = False) -> int:
        """aiohttp's path refused a request for want of room (errors.Overloaded): the early
        refusal checks request heads for a while, and the connection is held (when holds are
        on). Returns the refusal's Retry-After."""
        if self.early is not None:
            self.early.overloaded()
        return self.hold(transport, body_pending) if transport is not None else 1

    def hold(self, transport, body_pending: bool = False) -> int:
        """Stop reading `transport` for the seconds returned, its refusal's Retry-After
        (`body_pending`: the refused request's body has not all arrived). A connection held
        again (a pipelined request refused) starts a new hold. With holds off
        (hold_refused_connections: false), or a keep-alive timeout too short for one, only
        says 1."""
        if not self.hold_refused:
            return 1  # what hold_seconds says of one held connection: nothing else is held
        conn = self._conns.get(transport)
        seconds = hold_seconds(self.held + 1, self.keepalive_timeout_s, body_pending)
        if not seconds or conn is None or transport.is_closing():
            return seconds or 1
        self._unhold(conn)
        transport.pause_reading()
        conn.hold = self._loop.call_later(seconds, self._release, conn)
        self.held += 1
        self.holds += 1
        return seconds

    def _release(self, conn: TrackedConnection) -> None:
        conn.hold = None
        self.held -= 1
        if not conn.transport.is_closing():
            conn.transport.get_protocol().read_on()  # its guard: reads on, feeds what came meanwhile

    def _unhold(self, conn: TrackedConnection) -> None:
        if conn.hold is not None:
            conn.hold.cancel()
            conn.hold = None
            self.held -= 1

    # -- the send deadline (called by the guard) -------------------------------------------------
    def writing_paused(self, conn: TrackedConnection) -> None:
        if self.send_min_bytes_per_s:
            conn.clock = SendClock(self._loop.time(), conn.transport.get_write_buffer_size())

    def writing_resumed(self, conn: TrackedConnection) -> None:
        conn.clock = None

    # -- phases (called by tracking.py's middleware) ----------------------------------------------
    def request_started(self, transport) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.phase = BUSY

    def request_finished(self, transport, closes: bool = False) -> None:
        """A request aiohttp ran has its answer; `closes`: one that closes the connection."""
        conn = self._conns.get(transport)
        if conn is not None:
            conn.phase, conn.since = IDLE, self._loop.time()
            conn.forwarded = max(0, conn.forwarded - 1)
            conn.closing = conn.closing or closes
            self.answered(conn)

    def answered(self, conn: TrackedConnection) -> None:
        """A request on `conn` was answered: during the drain it closes once its answers are out
        (but one opened during the drain, for /metrics)."""
        if not self.accepting and not conn.late and conn.transport in self._conns:
            self.idle.discard(conn)
            self.sending.add(conn)

    def _sweep(self) -> None:
        due, self._sweeper = self._sweeper.when(), None
        now = self._loop.time()
        discount(self._conns.values(), stalled(now, due, self._period, self.keepalive_timeout_s))
        for conn in list(self._conns.values()):
            if conn.clock is not None and conn.clock.overdue(now, conn.transport.get_write_buffer_size(),
                                                             self.send_timeout_s, self.send_min_bytes_per_s):
                self.counts["slow_reader"] += 1
                reset_on_close(conn.transport)
                self._close(conn, drop_unsent=True)
            elif conn.phase == IDLE and now - conn.since > self.keepalive_timeout_s:
                if unread_bytes(conn.transport) and conn.transport.is_reading():
                    continue  # what waits is a request: the loop reads it next (idle_clock.py)
                if answers_pending(conn):
                    unsent = conn.transport.get_write_buffer_size()
                    if unsent < conn.unsent:  # the client took some since the last sweep: progress
                        conn.since = now
                    conn.unsent = unsent
                    # while its writing is paused the send deadline judges its client (above), whose clock may
                    # start after `since` (aiohttp writes an answer after its request ends) and allows for what
                    # was taken: this rule cut such a client first, as idle_timeout
                    if now - conn.since <= self.send_timeout_s or conn.clock is not None:
                        continue
                    if unsent:
                        reset_on_close(conn.transport)  # what it has not taken is dropped
                self.counts["idle_timeout"] += 1
                self._close(conn, drop_unsent=True)
            elif conn.phase == HEAD and now - conn.since > self.header_timeout_s:
                self.counts["header_timeout"] += 1
                self._close(conn)
        if self.churn.swept(lambda: any(each.phase != IDLE for each in self._conns.values())) or self._conns:
            self._sweeper = self._loop.call_later(self._period, self._sweep)  # (churn: a trim owed, for when quiet)

    # -- shutdown -------------------------------------------------------------------------------
    def stop_accepting(self, drain_s: float) -> None:
        """New connections are taken for GET and HEAD /metrics alone; those not running a request are
        closed once their answers are out (`sending`), or those idle once their grace ends (`idle`: GRACE_S,
        within the drain's `drain_s`) unless a request comes, or when the drain ends."""
        self.accepting = False
        self._deadline = time.monotonic() + drain_s  # the drain's end: the grace's 503s linger no longer
        idle = []
        for conn in list(self._conns.values()):
            if conn.phase != BUSY and answers_pending(conn):
                self.sending.add(conn)
            elif conn.phase != BUSY:
                idle.append(conn)
        self.idle.begin(idle, drain_s)

    def _after_grace(self, conn: TrackedConnection) -> None:
        """`conn` was idle when the drain began, and is still open as its grace ends: answered 503 and
        closed the lingering way (`_answer_last`: a request its client writes at that instant reads it), or,
        when a request came meanwhile and is not answered yet, closed once its answer is out."""
        if self._conns.get(conn.transport) is not conn:
            return
        if conn.phase == BUSY or answers_pending(conn):
            self.sending.add(conn)
        elif not self._answer_last(conn, self._deadline):
            self._close(conn)

    def late(self, transport) -> bool:
        """The connection was opened during the drain (only GET and HEAD /metrics are answered on it)."""
        conn = self._conns.get(transport)
        return conn is not None and conn.late

    def over(self, transport) -> bool:
        """The connection was taken over max_connections (a probe alone is answered on it, then it closes)."""
        conn = self._conns.get(transport)
        return conn is not None and conn.over

    def close_all(self, deadline: float | None = None) -> None:
        """The drain has ended: new connections refused; one with no request under way answered 503 and closed
        the lingering way until `deadline` (time.monotonic(); None: now) at most (`_answer_last`), the others
        closed, what their clients have not taken dropped (a request run or a body arriving was answered)."""
        self.closed = True
        deadline = deadline if deadline is not None else time.monotonic()
        for conn in list(self._conns.values()):
            if not self._answer_last(conn, deadline):
                self._close(conn, drop_unsent=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.idle.end()
        self.sending.end()

    def _answer_last(self, conn: TrackedConnection, deadline: float) -> bool:
        """Close `conn` after a last answer, if it has no request under way and nothing unsent (idle, or a
        request head still coming: guard.between_requests) and is not closing already: it is sent, unasked,
        the 503 a new connection gets once the drain has ended, and closed the lingering way until `deadline`
        (time.monotonic()) at most (lingering.py), so a request its client writes at that instant reads that
        503, where a bare close reset it. False, and nothing done, when it does not qualify."""
        self.outbox.flush()  # (an answer of the guard's waiting there is one unsent)
        if (conn.guard is None or conn.phase == BUSY or conn.closing or answers_pending(conn)
                or not conn.guard.between_requests() or conn.transport.is_closing()):
            return False
        self._untrack(conn)
        conn.guard.answered_last()  # what its client still sends is dropped
        self.lingering.close(conn.transport, self.closing_answer(), deadline, capped=False)
        return True

    def _close(self, conn: TrackedConnection, drop_unsent: bool = False) -> None:
        # drop_unsent (the drain has ended, a client too slow): a close keeps sending, for as long as its client
        # takes nothing (aiohttp waiting for it held the exit 2 s)
        self.outbox.flush()  # an answer made for this connection goes out before it closes (all go)
        self._untrack(conn)
        if drop_unsent and conn.transport.get_write_buffer_size():
            conn.transport.abort()
        else:
            conn.transport.close()

    def _untrack(self, conn: TrackedConnection) -> None:
        self._pop(conn)
        self.sending.discard(conn)
        self.idle.discard(conn)
        self._unhold(conn)

    def _pop(self, conn: TrackedConnection) -> None:
        if self._conns.pop(conn.transport, None) is conn:
            self.spare.left(conn)
            self.churn.closed[conn.tls] += 1

