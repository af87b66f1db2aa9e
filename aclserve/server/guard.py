"""Each connection's protocol: the guard in front of aiohttp's own (connections.py counts,
times and caps the connections; only public API: each connection's aiohttp protocol is a
web.RequestHandler of the runner's `server`, made by malformed.py's factory).

The guard forwards every byte to aiohttp's RequestHandler unless it answers a request itself.
Each request is framed (framing.py), so that nothing after one that ends its connection reaches
aiohttp (`Connection: close`: its parser would refuse it in place of that request's answer).
With an EarlyRefusal (shed_before_parsing, shedding.py) or DirectInfer (direct_infer,
direct.py) set, each head is offered to them first, while no request handed to aiohttp is
unanswered (answers keep their order):

- early refusals: for a while after an overload refusal, a plain request whose queue level is
  full is answered 503 here, at a quarter of what aiohttp's path costs the loop;
- direct answers: a plain infer request whose body came with its head is answered here, through
  the same infer path, without aiohttp's request objects: the connection is BUSY while it runs,
  nothing more is read from it until the answer is written, and a connection lost meanwhile
  cancels it; an answer that leaves the transport's buffer over its limit stays charged to the
  memory budget until the buffer drains (answer_charge.py), and the tracker times its client
  (send_deadline.py).

Early refusals are written through the tracker's Outbox (outbox.py): those of one loop round
go out together at its end. Which requests are plain: plain.py. Loop thread only.

Over TLS the listener accepts plain TCP and the guard starts TLS itself (loop.start_tls) once
the tracker admits the connection: a handshake counts against max_connections and is timed as
a request head (header_timeout_s), as asyncio's own TLS listener, which hands a connection over
only once its handshake is done, could not.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from typing import Callable

from .budget import Lease
from .connections import ConnectionTracker
from .tracked_connection import BUSY, HEAD, IDLE
from .framing import ANSWERED, FORWARD, NEED_BODY, RequestFraming
from .direct import said_closing
from .shedding import refusal
from .spare_places import probe_head

log = logging.getLogger(__name__)

# How long a TLS connection the server closes waits for its client's close_notify before its
# socket goes: asyncio's default, 30 s, kept the descriptors of connections the tracker had
# already let go (outside max_connections), 4096 connections closed idle every 15 s held three
# times as many; a client that never answers loses nothing it had not been sent
TLS_SHUTDOWN_S = 1.0


def _shutdown_timeout(loop) -> dict:
    """start_tls's argument for TLS_SHUTDOWN_S: uvloop's takes it, asyncio's own from Python 3.11
    (on 3.10 its 30 s stand)."""
    if sys.version_info < (3, 11) and isinstance(loop, asyncio.BaseEventLoop):
        return {}
    return {"ssl_shutdown_timeout": TLS_SHUTDOWN_S}


class GuardedProtocol(asyncio.Protocol):
    """Forwards every request, framed (framing.py), to aiohttp's RequestHandler once the tracker
    admits the connection; with an early refusal (shedding.py) or direct answers (direct.py)
    set, each is offered to them first, while no request handed to aiohttp is unanswered
    (answers keep their order). While a request is answered here nothing more is read from the
    connection (what came is kept for after), and the next one is read only once the answer
    has gone out (or the transport's buffer has drained below its limit)."""

    __slots__ = ("_tracker", "_factory", "_tls", "_inner", "_conn", "_framing", "_serving", "_write_paused",
                 "_read_on_drain", "_unsent", "_refused")

    def __init__(self, tracker: ConnectionTracker, factory, tls: ssl.SSLContext | None = None):
        self._tracker, self._factory, self._tls = tracker, factory, tls
        self._inner = self._conn = self._framing = None
        self._serving: asyncio.Task | None = None  # the direct answer being made
        self._write_paused = False  # the transport's buffer is over its limit (the client reads slowly)
        self._read_on_drain = False  # a direct answer waits in that buffer: read on when it drains
        self._unsent: Lease | None = None  # the charge of the direct answers in that buffer (answer_charge.py)
        self._refused = False  # over max_connections, a request with no spare place came: refused as the feed ends

    def connection_made(self, transport) -> None:
        self._conn = self._tracker.admit(transport, plain=self._tls is None, guard=self)
        if self._conn is None:
            return
        if self._tls is None:
            self._begin(transport)
            return
        self._conn.phase = HEAD  # timed as a head: header_timeout_s
        loop = asyncio.get_running_loop()
        # started now, in this call: start_tls takes the transport over before the loop reads
        # it (pause_reading() here would not hold on uvloop, nor on asyncio before 3.12)
        run_now(loop.start_tls(transport, self, self._tls, server_side=True,
                               ssl_handshake_timeout=self._tracker.handshake_timeout_s,
                               **_shutdown_timeout(loop)), self._secured)

    def _secured(self, secure, error: BaseException | None) -> None:
        """The TLS handshake's end: aiohttp's protocol on the secure transport, or, when it
        failed, timed out or was cut (the sweep, an eviction, shutdown), the connection forgotten
        (asyncio closed it; connection_lost may not come for a handshake that never ended)."""
        if error is not None and not isinstance(error, OSError):  # an OSError is the client's (ssl.SSLError,
            log.warning("TLS handshake ended by %r", error)       # a reset, the timeout)
        elif isinstance(error, ssl.SSLError):  # refused by TLS itself: counted, where it left no trace
            self._tracker.tls_refused += 1
            log.debug("TLS handshake refused: %s", error)
        tracker, conn = self._tracker, self._conn
        # closed during the handshake: None (asyncio), or a transport closing already (uvloop hands
        # one back for a client gone before its hello, and no connection_lost follows: aiohttp
        # kept a handler for each, 51 KB a connection for good)
        if secure is None or secure.is_closing() or not tracker.secured(conn, secure):
            tracker.forget(conn)
            conn.transport.close()  # closed already, unless start_tls failed before it began
            self._conn = None  # whatever still comes is dropped
            return
        self._begin(secure)

    def _begin(self, transport) -> None:
        self._framing = RequestFraming(self._forward, self._answer, self._held, self._offered, self._passed)
        if not self._conn.over:  # over max_connections: aiohttp's handler is made for a probe alone (_answer)
            self._handled(transport)
        stash, self._conn.stash = self._conn.stash, []
        for data in stash:  # TLS: requests decrypted before start_tls returned
            self.data_received(data)

    def _handled(self, transport) -> None:
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            return  # refused: discard until closed
        if self._framing is None:  # TLS, done but start_tls has not returned yet: kept for _begin
            conn.stash.append(data)
            return
        if self._read_on_drain or self._held():
            # held, answering here, or the client not reading its answers: kept for later
            # (aiohttp's flow control may resume reading)
            self._stash(data)
            return
        if conn.phase == IDLE:
            conn.phase, conn.since = HEAD, self._tracker.now()
        framing = self._framing
        rest = framing.feed(data)
        if self._refused:  # over max_connections, its request has no spare place (_answer): nothing more is read
            self.answered_last()
            self._tracker.refuse_over(conn)
        elif rest:
            self._stash(rest)  # a hold began, or a direct answer, or the client reads nothing
        elif (not conn.forwarded and self._serving is None and framing.idle
              and not framing.lost):  # lost: requests are not counted
            conn.phase, conn.since = IDLE, self._tracker.now()  # what came was answered here

    def _forward(self, data: bytes) -> None:
        """Bytes for aiohttp. An answer of the guard's waiting in the outbox for this connection
        goes out first: aiohttp may answer within this call (its handler tasks start eagerly on
        Python 3.12+) and must not overtake it."""
        self._tracker.outbox.flush_before(self._conn.transport)
        if self._inner is None:  # over max_connections, and no probe found (framing given up): refused
            self._refused = True
            return
        self._inner.data_received(data)

    def _stash(self, data: bytes) -> None:
        """Keep `data` for later and stop reading. Whatever ends the wait reads on: a hold's
        release, a direct answer written, or (the client reading nothing, so the answers
        written here fill the transport's buffer) that buffer drained."""
        conn = self._conn
        conn.stash.append(data)
        conn.transport.pause_reading()
        if self._write_paused:
            self._read_on_drain = True

    def _offered(self) -> bool:
        """Whether request heads are offered to `_answer` now (else only framed)."""
        tracker = self._tracker
        return (tracker.direct is not None or (tracker.early is not None and tracker.early.active())
                or self._conn.over)

    def _answer(self, head, body_length: int, body: memoryview | None) -> str:
        conn = self._conn
        # taken over max_connections, its first request: refused here unless it is a probe given a spare place
        # (spare_places.py), the connection's place freed at once and what follows dropped; a probe is handed to
        # aiohttp, made now, and its answer closes the connection (tracking_middleware)
        if conn.over and self._inner is None:
            if self._refused or not self._tracker.spare.take(conn, probe_head(head)):
                self._refused = True
                return ANSWERED
            self._handled(conn.transport)
        if conn.forwarded:
            conn.forwarded += 1
            return FORWARD
        if conn.closing:  # aiohttp's last answer said `Connection: close`: it drops this as it closes
            return FORWARD
        tracker = self._tracker
        early = tracker.early
        # during the drain every request goes to aiohttp, whose answer says `Connection: close`
        # (tracking_middleware) and which reads nothing after it (RFC 9112 9.6); so does a probe over
        # max_connections (spare_places.py), whose answer closes its connection
        if early is not None and early.active() and tracker.accepting and not conn.over:
            decision = early.check(head, body_length, body)
            if decision == NEED_BODY:
                self._inner.keep_alive(True)  # aiohttp, not seeing it yet, must not close it as idle
                return NEED_BODY
            if decision is not None:
                seconds = tracker.hold(conn.transport)
                tracker.outbox.send(conn.transport, [refusal(decision.message, seconds)])
                conn.phase, conn.since = IDLE, tracker.now()
                # aiohttp, which did not see it, would close the connection keepalive_timeout_s
                # after its own last answer: its timer is stopped, the tracker's sweep times it
                self._inner.keep_alive(True)
                return ANSWERED
        # (a connection opened during the drain is one too: aiohttp's path refuses what it asks but /metrics)
        named = (tracker.direct.target(head, body_length)
                 if tracker.direct is not None and tracker.accepting and not conn.over else None)
        # answered here only with its body in hand (it came with its head, framing offers it
        # then): nothing is held for direct's sake
        if named is None or body is None:
            conn.forwarded += 1
            return FORWARD
        self._inner.keep_alive(True)  # aiohttp, which does not see it, must not close it as idle
        conn.phase = BUSY  # running: neither timed out nor evicted, as in aiohttp's handlers
        self._serving = asyncio.get_running_loop().create_task(self._respond(named, head, body))
        return ANSWERED

    async def _respond(self, named, head, body: memoryview) -> None:
        """Answer a request directly (direct.py), then read on. A connection lost meanwhile
        cancels this (the request leaves the queue)."""
        conn = self._conn
        transport = conn.transport
        tracker = self._tracker
        try:
            answer, charge = await tracker.direct.answer(named, head, body, transport)
        finally:
            self._serving = None
        if transport.is_closing():
            if charge is not None:
                charge.release()
            return
        tracker.outbox.flush_before(transport)
        closing = head.closes or not tracker.accepting
        transport.writelines(said_closing(answer) if closing else answer)
        if charge is not None:
            self._charge_unsent(charge)
        conn.phase, conn.since = IDLE, tracker.now()
        tracker.answered(conn)  # during the drain: closed once it is out
        if closing:  # RFC 9112 9.6: nothing after an answer that said `Connection: close` is read
            conn.closing = True  # (nor answered: the drain's end leaves it to close as it does)
            conn.stash.clear()
            if tracker.accepting:
                transport.close()  # once the answer is out, as aiohttp's path closes it
            else:
                transport.pause_reading()
            return
        if self._write_paused:  # a client that does not read its answers sends no more requests
            self._read_on_drain = True
            transport.pause_reading()
        elif conn.hold is None:  # a hold (an overload refusal) reads on when it ends
            self.read_on()

    def _charge_unsent(self, charge: Lease) -> None:
        """A direct answer just written stays charged while it leaves the transport's buffer over
        its limit (the client reads slowly, or not at all): until resume_writing, or the
        connection is lost. Given back at once otherwise (the common case)."""
        if not self._write_paused:
            charge.release()
        elif self._unsent is None:
            self._unsent = charge
        else:
            if charge.model != self._unsent.model:  # (answers of two models: the connection's, neither's share)
                self._unsent.attribute(None)
            self._unsent.take_over(charge)

    def read_on(self) -> None:
        """Read again, then feed what came while a direct answer was made (or its buffer
        drained, or a hold lasted: the tracker calls this when it ends). In that order: what is
        fed may pause reading again (aiohttp's own flow control, with requests queued; another
        direct answer), and that pause must stand."""
        conn = self._conn
        if not conn.transport.is_closing():
            conn.transport.resume_reading()
        stash, conn.stash = conn.stash, []
        for data in stash:
            self.data_received(data)  # keeps it again if another direct answer began

    def _passed(self) -> None:
        """A request forwarded while heads are not offered to `_answer`: answered by aiohttp
        all the same."""
        self._conn.forwarded += 1

    def _held(self) -> bool:
        """Nothing more is read now: a hold, a direct answer being made, or writing paused."""
        return self._conn.hold is not None or self._serving is not None or self._write_paused

    def between_requests(self) -> bool:
        """Whether no request is under way past the guard: none answered here unfinished, no body on
        its way to aiohttp (the tracker knows what aiohttp has not answered), framed throughout, TLS's
        handshake done. A head still coming, or a request held back for its body, is the guard's
        alone: aiohttp has seen none of it."""
        framing = self._framing
        return framing is not None and self._serving is None and not framing.lost and not framing.body_pending

    def answered_last(self) -> None:
        """The tracker answered this connection its last (a 503 as the drain or its grace ends) and closes it: what
        comes from now on is dropped, as on a connection refused before it was tracked."""
        self._conn = None
        self._read_on_drain = False

    def eof_received(self):
        """The client half-closed or closed: taken as gone (as nginx, 499, and Go's net/http
        do; a close cannot be told from a half-close here), so the connection closes and its
        requests leave the queue. A client that half-closes after its request (`nc -N`) gets
        no answer."""
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc) -> None:
        self._tracker.forget(self._conn)
        self._sent()
        if self._serving is not None:
            self._serving.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._conn is not None:
            self._tracker.writing_paused(self._conn)
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._conn is not None:
            self._tracker.writing_resumed(self._conn)
        self._sent()
        if self._inner is not None:
            self._inner.resume_writing()
        if self._read_on_drain:
            self._read_on_drain = False
            if self._conn.hold is None and not self._conn.transport.is_closing():
                self.read_on()

    def _sent(self) -> None:
        """The direct answers waiting in the transport's buffer are out (or dropped): their charge goes back."""
        if self._unsent is not None:
            self._unsent.release()
            self._unsent = None


def run_now(coro, done: Callable[[object, BaseException | None], None]) -> None:
    """Run `coro` (awaiting asyncio futures only) up to its first wait in this call, then on from
    each future it awaits once that one is done; then `done(result, None)`, or
    `done(None, exception)`. A task would run its first step only in the loop's next round
    (Python 3.12's eager tasks run it at once, as this does; 3.10 and 3.11 have none)."""
    try:
        waited = coro.send(None)
    except StopIteration as stop:
        done(stop.value, None)
    except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - handed to `done`
        done(None, e)
    else:
        waited.add_done_callback(lambda _: run_now(coro, done))
