"""Open connections: capped, timed, and closed at shutdown.

aiohttp has no connection cap and no request-head timeout, so the listening socket hands each
connection to a GuardedProtocol, a thin asyncio protocol in front of aiohttp's own (only public
API: the runner's `server` is the protocol factory). The ConnectionTracker knows each
connection's phase:

    IDLE  no request in progress (new, or answered and kept alive)   -> keepalive_timeout_s
    HEAD  bytes of a request head arrived, no handler yet            -> header_timeout_s
    BUSY  a handler runs (body reads have their own body_timeout_s)  -> no limit here

A sweep every second closes connections past their phase's limit. At `max_connections` a new
connection replaces the one idle longest (or the slowest head) if it has been so for at least
EVICT_AFTER_S, else it is answered 503 and closed. At shutdown every connection that is not
running a request is closed at once, and the rest when the drain ends. Loop thread only.

Direct answers: with a DirectInfer set (direct_infer, direct.py), each request is framed
(framing.py) and a plain infer request whose body came with its head is answered here,
through the same infer path, without aiohttp's request objects: the connection is BUSY while
it runs, nothing more is read from it until the answer is written, and a connection lost
meanwhile cancels it.

Overload refusals: with an EarlyRefusal set (shed_before_parsing, shedding.py), each request
is framed (framing.py) and, for a while after an overload refusal, its head is offered to it
first, so that the refusals of a saturated model cost the loop a quarter of what aiohttp's path
costs. Holds (hold_refused_connections, off by default): a request refused because the server
has no room (errors.Overloaded) is answered at once with Retry-After: N, and its connection is
then not read for those N seconds (`hold`). A client that retries at once then waits in its
socket instead of costing the loop another refusal (measured on one core with
tools/bench_overload.py: 1,000 such connections kept 0.91-0.93 of the model's capacity with
holds and 0.36-0.41 without); but a client that sends a new request on the refused connection
waits too, and one with a timeout shorter than N times out (an open loop at 4x capacity kept
0.60-0.62 with holds, 0.75-0.85 without). N grows with the connections held, so the refusals
answered stay near REFUSALS_PER_S whatever the number of clients (see `hold_seconds`).
"""
from __future__ import annotations

import asyncio
import logging
import math
import resource

from aiohttp import web

from .framing import ANSWERED, BODY_IF_HERE, FORWARD, NEED_BODY, RequestFraming
from .shedding import refusal

log = logging.getLogger(__name__)

IDLE, HEAD, BUSY = "idle", "head", "busy"
EVICT_AFTER_S = 1.0  # a connection idle (or in its head) this long may make room for a new one
FD_RESERVE = 512  # descriptors kept for model files, the watcher, logs and threads
_LINGER_S = 1.0  # a refused connection is closed after this, so the client can read the 503
_LINGER_MAX = 256
# Refusals per second the hold aims for while overloaded: an HTTP refusal costs the loop
# 0.1-0.2 ms (aiohttp's request and response, the body's bytes), so about 5 % of a core.
REFUSALS_PER_S = 250
HOLD_MAX_S = 10
# An answer sent before its request's body has all arrived (a refusal): aiohttp then reads and
# drops the rest for at most this long (its lingering_time) and closes the connection if it
# cannot. A hold stops that reading, so such a hold ends a second before.
BODY_LINGER_S = 2.0
PENDING_BODY_HOLD_S = math.floor(BODY_LINGER_S) - 1


def hold_seconds(held: int, keepalive_timeout_s: float, body_pending: bool = False) -> int:
    """Retry-After (whole seconds, as HTTP writes it) for a refusal while `held` connections
    (this one included) are held: each comes back once per hold, so `held / hold` refusals a
    second. At least 1, at most HOLD_MAX_S (PENDING_BODY_HOLD_S while the refused request's
    body is still arriving), and half a second or more below the keep-alive timeout (a held
    connection is idle: the sweep would close it first); 0 when that leaves no whole second
    (no hold)."""
    cap = min(PENDING_BODY_HOLD_S if body_pending else HOLD_MAX_S, math.floor(keepalive_timeout_s - 0.5))
    if cap < 1:
        return 0
    return max(1, min(cap, math.ceil(held / REFUSALS_PER_S)))


_FULL = refusal("server has too many open connections (max_connections); retry later", 1, close=True)
_CLOSING = refusal("server is shutting down", 1, close=True)


class _Conn:
    __slots__ = ("transport", "phase", "since", "hold", "stash", "forwarded")

    def __init__(self, transport, now: float):
        self.transport, self.phase, self.since = transport, IDLE, now
        self.hold: asyncio.TimerHandle | None = None  # set while held after a refusal
        self.stash: list[bytes] = []  # bytes that arrived anyway while held
        self.forwarded = 0  # requests handed to aiohttp and not finished yet


class GuardedProtocol(asyncio.Protocol):
    """Forwards everything to aiohttp's RequestHandler once the tracker admits the connection;
    with an early refusal (shedding.py) or direct answers (direct.py) set, each request framed
    (framing.py) is offered to them first, while no request handed to aiohttp is unanswered
    (answers keep their order). While a request is answered here nothing more is read from the
    connection (what came is kept for after), and the next one is read only once the answer
    has gone out (or the transport's buffer has drained below its limit)."""

    __slots__ = ("_tracker", "_factory", "_inner", "_conn", "_framing", "_serving", "_direct_asked",
                 "_write_paused", "_read_on_drain")

    def __init__(self, tracker: "ConnectionTracker", factory):
        self._tracker, self._factory = tracker, factory
        self._inner = self._conn = self._framing = None
        self._serving: asyncio.Task | None = None  # the direct answer being made
        # the target of the request now framed, when it asked for its body to be answered here
        self._direct_asked: tuple[str, str | None] | None = None
        self._write_paused = False  # the transport's buffer is over its limit (the client reads slowly)
        self._read_on_drain = False  # a direct answer waits in that buffer: read on when it drains

    def connection_made(self, transport) -> None:
        self._conn = self._tracker.admit(transport)
        if self._conn is not None:
            self._inner = self._factory()
            self._inner.connection_made(transport)
            if self._tracker.early is not None or self._tracker.direct is not None:
                self._framing = RequestFraming(self._inner.data_received, self._answer, self._held,
                                               self._offered, self._passed)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            return  # refused: discard until closed
        if conn.hold is not None or self._serving is not None or self._read_on_drain:
            # held, or answering here: kept for later (aiohttp's flow control may resume reading)
            conn.stash.append(data)
            conn.transport.pause_reading()
            return
        if conn.phase == IDLE:
            conn.phase, conn.since = HEAD, self._tracker.now()
        framing = self._framing
        if framing is None:
            self._inner.data_received(data)
            return
        rest = framing.feed(data)
        if rest:
            conn.stash.append(rest)  # a hold began: read when it ends
        elif (not conn.forwarded and self._serving is None and framing.idle
              and not framing.lost):  # lost: requests are not counted
            conn.phase, conn.since = IDLE, self._tracker.now()  # what came was answered here

    def _offered(self) -> bool:
        """Whether request heads are offered to `_answer` now (else only framed)."""
        tracker = self._tracker
        return tracker.direct is not None or (tracker.early is not None and tracker.early.active())

    def _answer(self, head, body_length: int, body: memoryview | None) -> str:
        conn = self._conn
        if conn.forwarded:
            conn.forwarded += 1
            return FORWARD
        tracker = self._tracker
        early = tracker.early
        # a request asked again with its body for direct's sake had its checks with its head
        named = self._direct_asked
        self._direct_asked = None
        if named is None and early is not None and early.active():
            decision = early.check(head, body_length, body)
            if decision == NEED_BODY:
                self._inner.keep_alive(True)  # aiohttp, not seeing it yet, must not close it as idle
                return NEED_BODY
            if decision is not None:
                seconds = tracker.hold(conn.transport)
                conn.transport.write(refusal(decision.message, seconds))
                conn.phase, conn.since = IDLE, tracker.now()
                # aiohttp, which did not see it, would close the connection keepalive_timeout_s
                # after its own last answer: its timer is stopped, the tracker's sweep times it
                self._inner.keep_alive(True)
                return ANSWERED
        if named is None and tracker.direct is not None:
            named = tracker.direct.target(head, body_length)
        if named is None:
            conn.forwarded += 1
            return FORWARD
        if body is None:  # answered here only with its body in hand: nothing is held for direct's sake
            self._direct_asked = named
            return BODY_IF_HERE
        self._inner.keep_alive(True)  # aiohttp, which does not see it, must not close it as idle
        conn.phase = BUSY  # running: neither timed out nor evicted, as in aiohttp's handlers
        self._serving = asyncio.get_running_loop().create_task(self._respond(named, head, bytes(body)))
        return ANSWERED

    async def _respond(self, named, head, body: bytes) -> None:
        """Answer a request directly (direct.py), then read on. A connection lost meanwhile
        cancels this (the request leaves the queue)."""
        conn = self._conn
        transport = conn.transport
        tracker = self._tracker
        try:
            answer = await tracker.direct.answer(named, head, body, transport)
        finally:
            self._serving = None
        if transport.is_closing():
            return
        transport.writelines(answer)
        conn.phase, conn.since = IDLE, tracker.now()
        if self._write_paused:  # a client that does not read its answers sends no more requests
            self._read_on_drain = True
            transport.pause_reading()
        elif conn.hold is None:  # a hold (an overload refusal) reads on when it ends
            self._read_on()

    def _read_on(self) -> None:
        """Read again, then feed what came while a direct answer was made (or its buffer
        drained). In that order: what is fed may pause reading again (aiohttp's own flow
        control, with requests queued; another direct answer), and that pause must stand."""
        conn = self._conn
        if not conn.transport.is_closing():
            conn.transport.resume_reading()
        stash, conn.stash = conn.stash, []
        for data in stash:
            self.data_received(data)  # keeps it again if another direct answer began

    def _passed(self) -> None:
        """A request forwarded without a decision of `_answer`'s (heads not offered, or its body
        not in hand for a direct answer): answered by aiohttp all the same."""
        self._direct_asked = None
        self._conn.forwarded += 1

    def _held(self) -> bool:
        return self._conn.hold is not None or self._serving is not None

    def eof_received(self):
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc) -> None:
        self._tracker.forget(self._conn)
        if self._serving is not None:
            self._serving.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._inner is not None:
            self._inner.resume_writing()
        if self._read_on_drain:
            self._read_on_drain = False
            if self._conn.hold is None and not self._conn.transport.is_closing():
                self._read_on()


class ConnectionTracker:
    """Owned by the server state. `factory(inner)` makes the listening socket's protocols."""

    def __init__(self, max_connections: int, header_timeout_s: float, keepalive_timeout_s: float,
                 hold_refused: bool = False):
        self.max_connections = max_connections
        self.hold_refused = hold_refused
        self.header_timeout_s = header_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.accepting = True
        self.counts = {"refused": 0, "evicted": 0, "header_timeout": 0, "idle_timeout": 0}
        self.early = None  # shedding.EarlyRefusal: infer requests refused before aiohttp sees them
        self.direct = None  # direct.DirectInfer: plain infer requests answered without aiohttp
        self.held = 0  # connections held now
        self.holds = 0  # holds since start
        self._conns: dict[object, _Conn] = {}
        self._lingering = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._period = max(0.05, min(1.0, header_timeout_s / 4, keepalive_timeout_s / 4))

    def __len__(self) -> int:
        return len(self._conns)

    def now(self) -> float:
        return self._loop.time()

    def factory(self, inner):
        return lambda: GuardedProtocol(self, inner)

    # -- admission ------------------------------------------------------------------------------
    def admit(self, transport) -> _Conn | None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        if not self.accepting:
            self._refuse(transport, _CLOSING)
            return None
        if len(self._conns) >= self.max_connections:
            victim = self._evictable(now)
            if victim is None:
                self.counts["refused"] += 1
                self._refuse(transport, _FULL)
                return None
            self.counts["evicted"] += 1
            self._close(victim)
        conn = self._conns[transport] = _Conn(transport, now)
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self._period, self._sweep)
        return conn

    def _evictable(self, now: float) -> _Conn | None:
        best = None
        for conn in self._conns.values():
            if conn.phase != BUSY and now - conn.since >= EVICT_AFTER_S:
                rank = (conn.phase == HEAD, conn.since)  # idle ones first, oldest first
                if best is None or rank < best[0]:
                    best = (rank, conn)
        return best[1] if best else None

    def _refuse(self, transport, answer: bytes) -> None:
        transport.write(answer)
        if self._lingering >= _LINGER_MAX:
            transport.close()
            return
        self._lingering += 1
        if transport.can_write_eof():
            transport.write_eof()

        def close():
            self._lingering -= 1
            transport.close()
        self._loop.call_later(_LINGER_S, close)

    def forget(self, conn: _Conn | None) -> None:
        if conn is not None:
            self._conns.pop(conn.transport, None)
            self._unhold(conn)

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
        conn = self._conns.get(transport)
        seconds = hold_seconds(self.held + 1, self.keepalive_timeout_s, body_pending)
        if not self.hold_refused or not seconds or conn is None or transport.is_closing():
            return seconds or 1
        self._unhold(conn)
        transport.pause_reading()
        conn.hold = self._loop.call_later(seconds, self._release, conn)
        self.held += 1
        self.holds += 1
        return seconds

    def _release(self, conn: _Conn) -> None:
        conn.hold = None
        self.held -= 1
        stash, conn.stash = conn.stash, []
        transport = conn.transport
        if transport.is_closing():
            return
        transport.resume_reading()  # first: what is fed may pause it again (aiohttp's flow control)
        protocol = transport.get_protocol()
        for data in stash:
            protocol.data_received(data)

    def _unhold(self, conn: _Conn) -> None:
        if conn.hold is not None:
            conn.hold.cancel()
            conn.hold = None
            self.held -= 1

    # -- phases (called by tracking_middleware) -------------------------------------------------
    def request_started(self, transport) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.phase = BUSY

    def request_finished(self, transport) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.phase, conn.since = IDLE, self._loop.time()
            conn.forwarded = max(0, conn.forwarded - 1)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self._loop.time()
        for conn in list(self._conns.values()):
            if conn.phase == IDLE and now - conn.since > self.keepalive_timeout_s:
                self.counts["idle_timeout"] += 1
                self._close(conn)
            elif conn.phase == HEAD and now - conn.since > self.header_timeout_s:
                self.counts["header_timeout"] += 1
                self._close(conn)
        if self._conns:
            self._sweeper = self._loop.call_later(self._period, self._sweep)

    # -- shutdown -------------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """New connections are refused; those not running a request are closed now."""
        self.accepting = False
        for conn in list(self._conns.values()):
            if conn.phase != BUSY:
                self._close(conn)

    def close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.transport, None)
        self._unhold(conn)
        conn.transport.close()


def tracking_middleware(tracker: ConnectionTracker):
    """The app's outermost middleware: the tracker sees when each request starts and ends (a
    connection running one is neither evicted nor timed out)."""
    @web.middleware
    async def track(request: web.Request, handler) -> web.StreamResponse:
        transport = request.transport
        tracker.request_started(transport)
        try:
            response = await handler(request)
            if response.compression:
                # aiohttp compresses a large body in a thread when it prepares the answer, after
                # this: done here, the request still counts until its answer is written (the
                # guard must not write an early refusal before it); headers are written with the body
                await response.prepare(request)
            return response
        finally:
            tracker.request_finished(transport)
    return track


async def listen(runner: web.AppRunner, tracker: ConnectionTracker, host: str, port: int,
                 backlog: int) -> asyncio.Server:
    """Listen on host:port with the runner's aiohttp server as the protocol (its public use as a
    low-level server), each connection going through the tracker. The caller closes the listener
    (before runner.cleanup(), which shuts the connections down)."""
    return await asyncio.get_running_loop().create_server(
        tracker.factory(runner.server), host, port, backlog=backlog, reuse_address=True)


def fit_descriptor_limit(max_connections: int) -> int:
    """Raise the soft descriptor limit to fit max_connections (+ refusals lingering + a reserve
    for model files); if the hard limit is lower, return a lowered max_connections (warned)."""
    need = max_connections + _LINGER_MAX + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(1, soft - _LINGER_MAX - FD_RESERVE)
        log.warning("max_connections lowered from %d to %d to fit the descriptor limit of %d (ulimit -n)",
                    max_connections, fitted, soft)
        return fitted
    return max_connections
