"""The gRPC endpoint's lifecycle: one grpc.aio server on the running event loop (the HTTP app's
loop), serving InferenceServicer and grpc.health.v1.Health (grpc_health.py) over the app's
ServerState.

Built by the composition root (aclserve/app.py), handed to server.app.serve(), which owns it
from then on: bound after the HTTP site, before the runtime starts, and served once the loads have
begun (readiness waits for them); at shutdown drained with
the HTTP requests (drain: the calls grpc has received but not handed to a handler taken first,
grpc_queued.py, which grpc's stop would end CANCELLED, nothing sent meanwhile, grpc_gate.py; then
every connection told to go at once, GOAWAY, and the port closed, so that clients reconnect
elsewhere, the calls started since answered UNAVAILABLE; then until no call is live, grpc_live.py,
or the drain's deadline; a connection without calls does not count) and stopped as the models close, within
the same deadline as the HTTP connections (stop: the calls still at work end UNAVAILABLE,
stalled clients included, then every connection closes once no call is live, at the deadline
at most).
Messages may be as large as `grpc_max_message_bytes` (at most `max_body_bytes`: config/server.py;
gRPC's own default is 4 MiB); responses are not limited, as over HTTP.

The HTTP limits, as grpc core spells them (server_options): at most `max_connections` calls at once
(maximum_concurrent_rpcs: HTTP runs at most one request per connection, so both transports admit as
many requests; the next call is answered RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!" by
grpc itself, counted for /metrics as grpc_refusals.py finds it) and at most `max_connections`
connections (more are closed as they are accepted; the descriptor limit is raised to fit both
transports), at most `grpc_max_concurrent_streams` calls at once on one connection
(grpc.max_concurrent_streams, HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: a call beyond it refused
REFUSED_STREAM by grpc core, which counts every call not yet cleaned up, one its client cancelled
included, so that HTTP/2 rapid reset is bounded too; without it one connection held every call of
the server for 30 s with calls whose answers it never took, and one opening and cancelling 20,000
calls a second had other clients' calls ended CANCELLED. 250, Go's HTTP/2 default, not HTTP/2's
advised 100: grpc counts a finished call against the cap until its cleanup, a little after its
status went out, so a client keeping 150 calls in flight on one channel, as tritonclient's
async_infer may, had one in ten refused "Stream removed" under a cap of 100), a connection that
has not said hello within `header_timeout_s` closed, and one without calls closed after
`keepalive_timeout_s`. A connection with calls open that stops answering
pings is closed after PING_AFTER_S + PING_TIMEOUT_S; one whose client pings too often (sooner than
`grpc_min_ping_interval_s` after its last ping, nothing sent since, more than `grpc_max_ping_strikes`
times) is closed by grpc, GOAWAY "too_many_pings", as Triton's flags of those names have it. A call
whose message stops half-way ends after `body_timeout_s` (grpc_intake.receive, every method). Every
connection is asked to go (GOAWAY) after `grpc_max_connection_age_s` and closed
`shutdown_timeout_s` later: the only end grpc offers for a call whose client stops reading its
answers (a handler cannot cancel its call: its status would wait behind the answer).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from . import grpc_log
from .address import address, shown_address
from .grpc_connections import ConnectionCount
from .grpc_gate import StopGate
from .grpc_health import SERVICE as HEALTH_SERVICE, HealthServicer
from .grpc_ipv4_wildcard import ipv6_held
from .grpc_live import LiveCalls
from .grpc_message_fit import MessageFit
from .grpc_metadata import METADATA_BYTES, MetadataScreen
from .grpc_queued import QueuedCalls
from .grpc_service import InferenceServicer

log = logging.getLogger(__name__)

# live, but not held by the drain (grpc_live.py): what the shutdown abandons, as over HTTP
REPOSITORY_CONTROL = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})
MAX_MESSAGE = 2**31 - 1  # what protobuf can carry at all
PING_AFTER_S = 60  # a connection with calls open and nothing received this long is pinged,
PING_TIMEOUT_S = 20  # and closed when the ping is not answered in this (a dead or stalled peer)
# _end_all_calls, timed as grpc's own stop begins with the drain, cancels every call still open this
# long after the drain's deadline; stop() ends them first, once the models' last answers are out
# (ANSWER_GRACE_S after it), or at its own deadline
STOP_BACKSTOP_S = 10.0
# The grace of grpc's own stop, which never ends it: grpc.aio's stop, called again while one runs,
# destroys the server once it has stopped, and a first call whose grace ends then cancels the calls of
# the destroyed server (grpc 1.85: a segfault, one stop in a few hundred when both began at once). The
# calls are ended by one stop(None) only (GrpcServer._end_all_calls), at the backstop or by stop().
GRACE_UNBOUNDED_S = 1e9
# the drain waits this long at most for grpc's queued calls (grpc_queued.py: a call whose headers
# core refused is counted there for good); typically the loop takes them within milliseconds
QUEUE_WAIT_S = 1.0


def port_taken(host: str, port: int) -> OSError | None:
    """The error binding host:port gives while another socket holds it, or a privileged port
    (None when free, or for port 0), found with a socket of our own set as grpc sets its own
    (SO_REUSEADDR, no SO_REUSEPORT: server_options)."""
    if not port:
        return None
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None  # a name that does not resolve: grpc's bind says so
    for family, kind, proto, _, sockaddr in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):  # (others may be of one family grpc can skip)
                    return e
    return None


def server_options(config, max_message_bytes: int, connections: int) -> list[tuple[str, int]]:
    def ms(seconds: float) -> int:
        return max(1, int(seconds * 1000))
    return [
        ("grpc.max_receive_message_length", min(max_message_bytes, MAX_MESSAGE)),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
        ("grpc.max_allowed_incoming_connections", connections),
        ("grpc.max_concurrent_streams", config.grpc_max_concurrent_streams),
        # (its default) the cap counts every call grpc has not cleaned up, those cancelled included
        ("grpc.http.overload_protection", 1),
        ("grpc.server_handshake_timeout_ms", ms(config.header_timeout_s)),
        # grpc's hard limit at its soft one: a call under it always passes (the two differ by default:
        # calls between them were refused at random)
        ("grpc.max_metadata_size", METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", METADATA_BYTES),
        ("grpc.max_connection_idle_ms", ms(config.keepalive_timeout_s)),
        ("grpc.keepalive_time_ms", ms(PING_AFTER_S)),
        ("grpc.keepalive_timeout_ms", ms(PING_TIMEOUT_S)),
        # the client pings taken (grpc's defaults, 5 minutes and none without calls, closed a
        # tritonclient pinging every 10 s "Too many pings"); with permit, grpc pings a connection
        # without calls too, which matters only when keepalive_timeout_s is past PING_AFTER_S
        ("grpc.keepalive_permit_without_calls", int(config.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.grpc_min_ping_interval_s * 1000)),
        ("grpc.http2.max_ping_strikes", config.grpc_max_ping_strikes),
        # without BDP probing a stream's window stays at grpc's 64 KB lookahead until its handler
        # reads (with it, 4 MiB: what a client may send per call before anything reads it)
        ("grpc.http2.bdp_probe", 0),
        ("grpc.enable_channelz", 1),  # (its default) the calls received, which the drain waits for: grpc_queued.py
    ] + ([("grpc.max_connection_age_ms", ms(config.grpc_max_connection_age_s)),
          ("grpc.max_connection_age_grace_ms", ms(config.shutdown_timeout_s))]
         if config.grpc_max_connection_age_s > 0 else [])


class _MethodTable:
    """Catches the method table the generated add_..._to_server registers."""

    def __init__(self):
        self.service, self.handlers = "", {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, dict(handlers)


def method_handlers(servicer: InferenceServicer) -> tuple[str, dict]:
    """(service name, method table): the generated one, except that every unary method is
    client-streaming on this side, a unary call on the wire, so that its handler reads the
    message itself, within body_timeout_s (grpc's own unary handling waits for it without a
    limit, holding the call's slot), and ModelInfer and ModelStreamInfer receive raw bytes
    (charged before they are parsed: grpc_intake.py)."""
    table = _MethodTable()
    pbg.add_GRPCInferenceServiceServicer_to_server(servicer, table)
    if "ModelInfer" not in table.handlers:
        raise RuntimeError("tritonclient's generated gRPC service no longer registers its methods by name")
    handlers = {name: handler if handler.request_streaming else grpc.stream_unary_rpc_method_handler(
                    servicer.one_message(handler.unary_unary, handler.request_deserializer),
                    response_serializer=handler.response_serializer)
                for name, handler in table.handlers.items()}
    handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
        servicer.ModelInfer, response_serializer=pb.ModelInferResponse.SerializeToString)
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer, response_serializer=pb.ModelStreamInferResponse.SerializeToString)
    return table.service, handlers


class GrpcServer:
    """Owns one grpc.aio.Server. start() binds and serves; drain() takes the calls grpc holds for
    the loop (grpc_queued.py, grpc_gate.py), has every connection told to go and waits for the
    calls live (grpc_live.py); stop() ends those still at work with UNAVAILABLE
    "server is shutting down" (open_calls.py) and, once every call has finished (its status
    sent) or at its deadline, closes every connection, cancelling what is left. There is one
    stop, however often stop() is called, and none cancels it."""

    def __init__(self, state, max_message_bytes: int):
        self.state = state
        self.port: int | None = None
        config = state.config
        self.max_connections = state.grpc_max_connections  # what the descriptor limit leaves it (server/app.py)
        self._queued = QueuedCalls()
        self._server = self._queued.server(lambda: grpc.aio.server(
            options=server_options(config, max_message_bytes, self.max_connections),
            maximum_concurrent_rpcs=config.max_connections))
        grpc_log.install()  # a client gone under its answer is not an ERROR with a traceback
        # (built before the loads begin: server/app.py) a model whose largest request grpc would refuse is said
        state.repo.add_listener(MessageFit(max_message_bytes).on_repository_event)
        self._servicer = InferenceServicer(state)
        self._health = HealthServicer(state, self._servicer.calls)
        self._gate = StopGate(state.redact)
        self._live = LiveCalls(self._gate)
        self._metadata = MetadataScreen(self._live.counted, state.trimmer.freed)
        # One generic handler, no registered methods: grpc.aio keeps a call request open per
        # registered method and awaits all of them (asyncio.wait) for every call it accepts; the
        # 22 methods served cost each call about 12 us of the loop
        self._server.add_generic_rpc_handlers((self._queued.dispatcher({
            f"/{service}/{name}": self._live.counted(handler, name, holds_drain=name not in REPOSITORY_CONTROL)
            for service, handlers in (method_handlers(self._servicer), (HEALTH_SERVICE, self._health.handlers()))
            for name, handler in handlers.items()}, state.grpc_refusals.method_not_found, self._metadata.screen),))
        # the calls grpc refuses for its call limit: those its dispatcher was asked for and did not start
        state.grpc_refusals.follow(lambda: self._queued.taken, lambda: self._live.started)
        # (/metrics: aclserve_connections{transport="grpc"}, read once a second at most)
        state.grpc_connections = ConnectionCount(lambda: self._queued.channelz_id)
        self._tls = state.tls
        if self._tls is not None:
            self._tls.load()  # read now: a bad file stops the start
        self._port_credentials: list = []  # each TLS port's own (tls_renewal.py), kept while grpc serves it
        self._started = False
        self._start_begun = False  # serve() has called grpc's start (which a cancel may have cut short)
        self._stopping: asyncio.Future | None = None  # grpc's own stop, from the drain on
        self._end_at = float("inf")  # when _end_all_calls runs, at the latest (time.monotonic())
        self._backstop: asyncio.TimerHandle | None = None  # its timer
        self._ending: asyncio.Future | None = None  # grpc's stop ending every call
        self._end_begun = asyncio.Event()
        self._stop_task: asyncio.Future | None = None  # stop()'s, which every call of it awaits

    async def start(self, host: str, port: int) -> int:
        """Bind host:port and serve; returns the bound port. OSError when it cannot bind."""
        self.bind([host], port)
        return await self.serve()

    def bind(self, hosts: list[str], port: int) -> int:
        """Bind each of `hosts` (listen_hosts.py: addresses, not names grpc would resolve its own way)
        at `port` (for port 0, the one the first bind got), not serving yet (serve()); returns the
        bound port. OSError when one cannot be bound. Once bound, stop() is what lets the port go."""
        for host in hosts:
            port = self._bind_one(host, port)
        self.port = port
        return port

    def _bind_one(self, host: str, port: int) -> int:
        taken = port_taken(host, port)
        if taken is not None:  # said here: grpc core's own bind failure is an extra ERROR line on stderr
            raise OSError(f"gRPC cannot listen on {shown_address(host, port)}: {taken.strerror} "
                          "(--grpc-port PORT moves it, --grpc-port 0 turns gRPC off)")
        try:
            with ipv6_held(host, port) as port:  # 0.0.0.0: IPv4 only, as HTTP (grpc_ipv4_wildcard.py)
                if self._tls is None:
                    bound = self._server.add_insecure_port(address(host, port))
                else:
                    self._port_credentials.append(self._tls.grpc_credentials())
                    bound = self._server.add_secure_port(address(host, port), self._port_credentials[-1])
        except RuntimeError as e:  # grpcio raises RuntimeError("Failed to bind ...")
            raise OSError(f"gRPC cannot listen on {shown_address(host, port)}: {e}") from None
        if not bound:
            raise OSError(f"gRPC cannot listen on {shown_address(host, port)}")
        return bound

    async def serve(self) -> int:
        """Serve on the port bind() bound; returns it."""
        self._start_begun = True  # (a stop from here on stops it as it is: a second start is grpc's usage error)
        await self._server.start()
        self._started = True
        return self.port

    async def drain(self, deadline: float) -> None:
        """Take no new calls nor connections from now. First the calls grpc has received and not
        handed to a handler yet are taken (grpc's stop would end them CANCELLED, which retry
        policies keyed on UNAVAILABLE do not retry: grpc_queued.py), within QUEUE_WAIT_S; the
        gate is closed meanwhile (grpc_gate.py): a call starting waits, then is refused
        UNAVAILABLE, and an answer waits, so that no client is prompted to send another call.
        Then every connection is told to go (GOAWAY) and the port closes, so that a client's
        next call opens a new connection, to another replica (a client keeping its channel had
        every call refused "shutting down" for the whole drain, the connection going only at
        stop()), and the gate opens. Then wait until no call is live but
        repository loads and unloads, or until `deadline` (time.monotonic()). The calls in
        flight and the open streams go on (a stream reads nothing more and ends once its
        requests running are answered), as does a connection without calls until its client
        leaves; none of those holds the drain."""
        self._gate.close(self.state.stopping_message)
        self._servicer.drain_streams()
        self._health.drain()
        try:
            if self._started and not await self._queued.none_by(min(deadline, time.monotonic() + QUEUE_WAIT_S)):
                # INFO, not WARNING: the count is an upper bound, and a call grpc refused itself never ends CANCELLED
                log.info("gRPC: %d call(s) grpc counted as received were not handed to the server %g s into the "
                         "drain: any still queued in grpc are ended CANCELLED by its stop; the count may include "
                         "calls grpc refused itself (such as HEADERS without :path), which never reach the server",
                         self._queued.waiting(), QUEUE_WAIT_S)
        finally:  # (a second signal ends that wait: grpc's stop at once)
            self._stop_taking_calls(deadline + STOP_BACKSTOP_S)
        await self._live.holding_drain.none_by(deadline)

    def _stop_taking_calls(self, backstop: float) -> None:
        """grpc's own stop: GOAWAY to every connection, the port closed, new calls refused by
        grpc (and those core holds without a handler ended CANCELLED). Every call still open is
        ended at `backstop` (time.monotonic()) at the latest; stop() ends them before. The gate
        opens just after its first step, which sends the GOAWAYs and closes the port."""
        if self._started and self._stopping is None:
            self._stopping = self._logged(self._server.stop(GRACE_UNBOUNDED_S))
            asyncio.get_running_loop().call_soon(self._gate.open)  # (run after that step: call_soon is FIFO)
            self._end_all_calls_by(backstop)

    def _end_all_calls_by(self, deadline: float) -> None:
        """_end_all_calls at `deadline` (time.monotonic()), unless it is timed earlier already."""
        if self._ending is None and deadline < self._end_at:
            if self._backstop is not None:
                self._backstop.cancel()
            self._end_at = deadline
            self._backstop = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()),
                                                                   self._end_all_calls)

    def _end_all_calls(self) -> None:
        """grpc's stop at once: every call cancelled, every connection closed. The only grpc stop
        beside the drain's (GRACE_UNBOUNDED_S says why)."""
        self._backstop.cancel()
        if self._ending is None:
            self._ending = self._logged(self._server.stop(None))
            self._end_begun.set()

    @staticmethod
    def _logged(stopping) -> asyncio.Future:
        """grpc's stop as a task whose failure is logged when it ends, awaited or not (the
        backstop's may be neither)."""
        def failed(task: asyncio.Future) -> None:
            if not task.cancelled() and task.exception() is not None:
                log.error("gRPC: grpc's stop failed", exc_info=task.exception())
        task = asyncio.ensure_future(stopping)
        task.add_done_callback(failed)
        return task

    async def stop(self, deadline: float | None = None) -> None:
        """Take no new calls nor connections, end the calls still at work, then close every
        connection once no call is live or at `deadline` (time.monotonic(); default: now),
        cancelling the calls left then (an answer its client does not take). The stop is one
        task: a call cancelled leaves it running, a later call waits for it, and a later call's
        earlier deadline ends every call by then."""
        if not self._started:
            if self.port is not None:  # bound, never served: grpc lets a port go only once started and stopped
                self.port = None
                if not self._start_begun:
                    await self._server.start()
                await self._server.stop(None)
            return
        if deadline is None:
            deadline = time.monotonic()
        if self._stop_task is None:
            self._stop_taking_calls(deadline)  # begun by the drain, unless serving ended otherwise
            ended = self._servicer.calls.end(self.state.stopping_message)
            if ended:
                log.info("gRPC: %d call(s) still open at the shutdown deadline answered UNAVAILABLE", ended)
            self._stop_task = asyncio.ensure_future(self._closed())
        self._end_all_calls_by(deadline)
        await asyncio.shield(self._stop_task)

    async def _closed(self) -> None:
        """Until no call is live or every call is ended (at the earliest deadline of stop(), or
        the backstop), then until grpc has closed every connection (its graceful stop would also
        wait for the connections without calls)."""
        waits = [asyncio.ensure_future(self._live.all.none_by(self._end_at)),
                 asyncio.ensure_future(self._end_begun.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        self._end_all_calls()
        await asyncio.wait([self._ending, self._stopping])  # (a failure is logged: _logged)
        log.info("gRPC endpoint stopped")
