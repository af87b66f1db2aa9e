"""The aiohttp application and its ordered lifecycle, over objects built elsewhere (the
composition root, aclserve/app.py, builds the runtime, the repository and the gRPC server).

Start: `serve` listens on HTTP, then binds gRPC (a host or port either cannot have fails here, in
its one error line: nothing else has started), then starts the runtime (acl.init) and begins the
repository's loading as a task (devices, models) before anything more is awaited, starts serving
gRPC and waits for the repository (scan, load, warm up, watch); readiness is false until it is done. A
stop signal that came before `serve` set its handlers (recorded: startup_signals.py) ends it
before anything starts; one that comes until the repository is done is said to have come
during start-up, and stops the loads and compiles under way as any stop does.

Stop (SIGTERM/SIGINT in `serve`), within one deadline: readiness turns false, new infer
requests get 503 / UNAVAILABLE at once, HTTP connections not running a request are closed (one
opened during the drain is answered GET and HEAD /metrics alone: connections.py) and
every gRPC connection is told to go (GOAWAY, the gRPC port closed: grpc_server.py);
queued and in-flight requests and calls of both transports get `shutdown_timeout_s` to finish,
drained together (a gRPC connection without calls holds nothing); then the repository unloads
every model (the requests still waiting on one are answered 503; a device still running a batch
is left to itself, not waited for, ANSWER_GRACE_S after the deadline: runtime/teardown.py; a
load or warm-up still running is abandoned: repository/served.py); then, together, the answers
that close made are written (a repository load or unload's too, 503: state.answers_written) and
the gRPC calls still at work end UNAVAILABLE, and every
connection of both transports is closed once no request or call is left, ANSWER_GRACE_S after
the deadline at the latest (a stalled client does not hold shutdown longer, an idle one not at
all: state.answers_by; an HTTP one with no request under way is sent a 503 first, and read until
its client closes it, a second at most, within the deadline: connections.py); the HTTP socket
closes, and the runtime destroys contexts, resets devices and finalizes ACL, in that order, in a
thread waited for until state.answers_by at most (device_closes.py: a close waiting on a hung
device is left to it).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING

from aiohttp import web

from .. import startup_signals
from .._version import __version__
from ..acl.constants import error_meaning
from . import bad_request_log, device_closes, malformed, tls
from .listen_hosts import listen_hosts, said
from .listeners import Listeners, listen
from .open_calls import device_failure_message
from .app_keys import STATE
from .auth import access_middleware
from .connections import BODY_LINGER_S
from .tracking import tracking_middleware
from .descriptors import connections_wanted, fit_connection_caps
from .direct import DirectInfer
from .error_responses import error_middleware
from .routes import add_routes
from .state import ServerState

if TYPE_CHECKING:
    from .grpc_server import GrpcServer

log = logging.getLogger(__name__)

# `aclserve serve`'s exit status after a device failed as a whole (runtime/device_health.py): it
# drains as on SIGTERM and exits with it, so that its supervisor restarts it, which resets the
# device (EX_TEMPFAIL: a restart is what it needs)
EXIT_DEVICE_FAILED = 75
AFTER_DEVICE_FAILURE = (f"the server drains and exits with status {EXIT_DEVICE_FAILED} for its supervisor to "
                        "restart it; no instance is rebuilt on the device meanwhile")


async def _load(state: ServerState) -> None:
    # the devices models go on by default, opened before any load (which would open them): the
    # device memory gauges have their rows from the start, not from the first model placed there
    devices = state.config.model_defaults.devices
    await asyncio.get_running_loop().run_in_executor(None, state.runtime.open_devices, devices)
    await state.repo.start()
    state.started = True


async def _lifecycle(app: web.Application):
    """Start the runtime and begin loading the models (a task; under serve(), once it has bound the
    ports: begin_loading); at the end, drain and close."""
    state = app[STATE]
    state.repo.add_listener(state.draining.on_repository_event)
    state.repo.add_listener(state.metrics.on_repository_event)
    state.repo.add_listener(state.on_repository_event)
    state.repo.add_listener(state.images.on_repository_event)
    if not state.loads_after_listen:  # (an app served otherwise than by serve(): tests)
        begin_loading(state)
    try:
        yield
    finally:
        await state.begin_shutdown()
        try:
            await state.close_models()  # done already when `serve` drained
        finally:
            state.scrapes.close()  # (one taken during the drain, its scraper gone)
            state.started = False
            # off the loop and bounded: either may wait on a device (device_closes.py); the
            # decoders first, as DVPP's context is on a device the runtime resets
            closing = asyncio.ensure_future(device_closes.close_by(
                [("the image decoders' close", state.images.close),
                 ("the runtime's close (devices reset, ACL finalized)", state.runtime.close)], state.closes_by()))
            try:  # the traces still waiting are written meanwhile (blocking file I/O, off the loop)
                await asyncio.get_running_loop().run_in_executor(None, state.tracer.close)
            finally:
                if await closing and not state.start_failed:
                    log.info("runtime closed")


def begin_loading(state: ServerState) -> None:
    """Start the runtime (acl.init, its INFO line) and begin the repository's loading, as a task."""
    state.runtime.start()
    state.loading = asyncio.ensure_future(_load(state))


def create_app(config, repo, runtime) -> web.Application:
    """The KServe v2 app over an already-built repository and runtime (aclserve/app.py builds
    them). Starting it (AppRunner.setup / test client) starts `runtime`, then `repo` (under
    serve(), once the ports are bound); cleaning it up drains and closes them in reverse order.

    Every request aiohttp answers, infer included, runs inside the same middlewares, outermost
    first: connection tracking, errors to JSON, the API token check; plain infer requests are
    answered by the connection guard itself, which does their part (direct.py; not when the
    app is given middlewares of its own: `direct_answers`). Raises the process's descriptor
    limit to fit `max_connections` for HTTP and for gRPC (or shares what fits between them,
    warned) here, before anything else built on the app (the gRPC server) sizes itself from
    its cap."""
    state = ServerState(config, repo, runtime)
    http, grpc = fit_connection_caps(*connections_wanted(config), config.load_concurrency)
    state.connections.max_connections = http
    if config.grpc_port:  # (else gRPC's cap stays max_connections, for a GrpcServer made by hand)
        state.grpc_max_connections = grpc
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[tracking_middleware(state.connections), error_middleware,
                                       access_middleware(state.auth)])
    state.own_middlewares = tuple(app.middlewares)
    app[STATE] = state
    add_routes(app)
    app.cleanup_ctx.append(_lifecycle)
    return app


def direct_answers(app: web.Application) -> DirectInfer | None:
    """The guard's direct answers (direct.py), unless the config turns them off, aiohttp's access
    log is on (log_level debug: it lists every request) or the app was given middlewares beyond
    the server's own or response signal handlers (one added to the app must see every request)."""
    state = app[STATE]
    config = state.config
    if (config.direct_infer and config.log_level != "debug" and tuple(app.middlewares) == state.own_middlewares
            and not app.on_response_prepare):
        return DirectInfer(state)
    return None


# aiohttp's own keep-alive timer (handler_options): a backstop far behind the tracker's keepalive_timeout_s
AIOHTTP_KEEPALIVE_S = 3600.0


def handler_options(config, access_log: bool = False) -> dict:
    """aiohttp's options for each connection's handler: the runner's, and the guard's handlers
    (malformed.py) take the same.
    auto_decompress off: body.py inflates gzip/deflate itself, charging the memory as it goes.
    lingering_time: how long the unread rest of a refused body is read and dropped so the
    client sees the answer; a stalled client (408) is closed after it.
    keepalive_timeout: the tracker's sweep alone closes an idle connection (connections.py), as it
    counts it: aiohttp's own timer, at keepalive_timeout_s too, closed first, and after a pause of
    the process (SIGSTOP) it fired before the request waiting unread was read (idle_clock.py)."""
    options = {"auto_decompress": False, "keepalive_timeout": AIOHTTP_KEEPALIVE_S,
               "lingering_time": BODY_LINGER_S}
    if not access_log:
        options["access_log"] = None
    return options


def make_runner(app: web.Application, access_log: bool = False) -> web.AppRunner:
    # handler_cancellation: a client that disconnects cancels its handler, which removes the
    # request from the batch queue (run_app/AppRunner leave it off by default).
    bad_request_log.install()  # a client's malformed request is not an ERROR with a traceback
    return web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0,
                         **handler_options(app[STATE].config, access_log))


class _Stopping:
    """Why serving stops, as far as the lines of the stop say it: a device that failed as a whole
    (the first one: what the exit's last line names), whether a signal came, whether it came
    while the server was starting (its models' first loads and compiles not done)."""

    def __init__(self):
        self.device_failure = ""
        self.signalled = False
        self.starting = True
        self.asked_before = False  # a signal came before the handlers: nothing was started


def _on_signal(sig: signal.Signals, stop: asyncio.Event, hurry: asyncio.Event, stopping: _Stopping) -> None:
    """The first signal drains (to shutdown_timeout_s); another one, or one during the drain that a
    device failure started, ends the drain at once: what is still in flight is answered 503, as at
    the deadline."""
    if stopping.asked_before:  # (uvloop hands on a signal that came after it started, recorded already)
        return
    if hurry.is_set():
        log.warning("%s received again: the server is exiting", sig.name)
    elif stop.is_set():
        if stopping.signalled:
            after = "again"
        elif stopping.device_failure:
            after = f"during the drain that a device failure started ({stopping.device_failure})"
        else:  # (the caller's `stop`)
            after = "during the drain"
        log.warning("%s received %s: the drain ends now", sig.name, after)
        hurry.set()
    elif stopping.starting:  # (the loads and compiles under way are stopped as at any shutdown)
        startup_signals.say_stopped(sig)
    else:
        log.info("%s received: shutting down", sig.name)
    stopping.signalled = True
    stop.set()


def _on_ignored_hangup() -> None:
    log.warning("SIGHUP received: ignored, as the server was started with it ignored (nohup); SIGTERM stops it")


async def _drained(drains: list, hurry: asyncio.Event, state) -> None:
    """Wait for the drains, or until a second signal moves the shutdown deadline to now."""
    draining = asyncio.ensure_future(asyncio.gather(*drains))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait([draining, hurried], return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
    if not draining.done():
        draining.cancel()
        await asyncio.wait([draining])
        if not draining.cancelled():  # a gather cancelled through its drains holds their CancelledError:
            draining.exception()  # read, or asyncio logs an ERROR "exception was never retrieved"
        state.hurry()
        log.warning("shutdown hurried: %d request(s) still in flight are answered 503", state.infer_requests.count)
    else:
        draining.result()


async def _closed(state, hurry: asyncio.Event) -> None:
    """state.close_repository(); a second signal meanwhile moves its deadline to now: a load or
    a device it still waits for is abandoned then, as at the deadline."""
    closing = asyncio.ensure_future(state.close_repository())
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait([closing, hurried], return_when=asyncio.FIRST_COMPLETED)
        if not closing.done():
            state.hurry()
        await closing
    finally:
        hurried.cancel()


def _on_device_failure(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, stopping: _Stopping):
    """The runtime's callback (from its thread) for a device that failed as a whole: the server
    shuts down as on SIGTERM, and exits with EXIT_DEVICE_FAILED."""
    def failed(device_id: int, code: int) -> None:
        stopping.device_failure = (stopping.device_failure
                                   or f"device {device_id} failed as a whole ({code}: {error_meaning(code)})")
        loop.call_soon_threadsafe(stop.set)
    return failed


async def serve(app: web.Application, grpc_server: GrpcServer | None = None,
                started: asyncio.Future | None = None, stop: asyncio.Event | None = None) -> int:
    """Listen (HTTP, then `grpc_server` when given) until SIGTERM/SIGINT/SIGHUP (or `stop` is set),
    or until a device fails as a whole, then shut down in order (module docstring). `started`
    gets the bound (host, port) once listening. Owns the HTTP runner and stops `grpc_server`;
    the app's lifecycle closes the repository and runtime. Returns the exit status: 0, or
    EXIT_DEVICE_FAILED."""
    state = app[STATE]
    config = state.config
    if state.tls is not None:
        state.tls.load()  # a bad certificate stops the start before anything runs
    loop = asyncio.get_running_loop()
    access_log = config.log_level == "debug"
    runner = make_runner(app, access_log)
    stop = stop or asyncio.Event()
    hurry = asyncio.Event()  # a second signal: the drain ends at once
    why_stopping = _Stopping()
    state.runtime.on_device_failure(_on_device_failure(loop, stop, why_stopping), AFTER_DEVICE_FAILURE)
    # SIGHUP too: a closed terminal or session (or `kill -HUP` meant as a reload) drains as
    # SIGTERM does, rather than killing the process with its requests
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # started under nohup: a closed terminal is to be ignored, as asked; said, for a `kill -HUP`
        ignored = sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN
        try:
            if ignored:
                loop.add_signal_handler(sig, _on_ignored_hangup)
            else:
                loop.add_signal_handler(sig, _on_signal, sig, stop, hurry, why_stopping)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
            pass
    # one received before, while the process started (cli records them: startup_signals.py)
    asked_before = startup_signals.take()
    listener: Listeners | None = None
    listening = False
    state.tracer.log_startup()  # (the merged config's trace settings that trace nothing)
    # Bound first, then the runtime and the loads: a start that cannot bind says so in its one line
    state.loads_after_listen = True
    try:
        if asked_before is not None:  # nothing started yet: what was built is closed below
            why_stopping.asked_before = True
            startup_signals.say_stopped(asked_before)
            return 0
        await runner.setup()
        state.connections.direct = direct_answers(app)
        # each connection's aiohttp handler answers what its parser refuses in JSON (malformed.py)
        handlers = malformed.handlers(runner.server, handler_options(config, access_log),
                                      config.grpc_port if grpc_server is not None else 0)
        hosts = listen_hosts(config.host, config.port)  # a name resolved once, for both transports
        listener = await listen(handlers, state.connections, hosts, config.port, config.listen_backlog,
                                state.tls.http_context if state.tls is not None else None)
        host, port = listener.sockets[0].getsockname()[:2]
        if grpc_server is not None:
            grpc_port = grpc_server.bind(hosts, config.grpc_port)  # (not awaited: no request is read yet)
        # readiness stays false until the models are in; begun before anything more is awaited, so
        # no HTTP request finds the repository not begun (a model's 404 that a load would serve)
        begin_loading(state)
        log.info("aclserve %s listening on %s", __version__,
                 said(hosts, port, "https://" if tls.enabled(config) else "http://"))
        if grpc_server is not None:
            await grpc_server.serve()
            log.info("aclserve gRPC listening on %s%s", said(hosts, grpc_port),
                     " (TLS)" if tls.enabled(config) else "")
        listening = True
        if state.tls is not None:
            state.tls.watch()  # renewed files taken from now on (tls_renewal.py)
        state.auth.log_startup()  # (about the address listened on: once it is)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([state.loading, stopping], return_when=asyncio.FIRST_COMPLETED)
            if state.loading.done():
                state.loading.result()  # a repository that cannot start (no models folder) ends here
                why_stopping.starting = False
                state.readiness_log.started(state.ready())  # (and a line at each change from now on)
                if started is not None and not started.done():
                    started.set_result((host, port))
            await stopping
        finally:
            stopping.cancel()
        if why_stopping.device_failure:  # the drain's refusals say why the server stops, and that it comes back
            state.stopping_message = device_failure_message(why_stopping.device_failure, EXIT_DEVICE_FAILED)
        log.info("draining")
        state.stop_accepting()  # the deadline, for both transports
        drains = [state.begin_shutdown()]  # HTTP and gRPC infer requests alike
        if grpc_server is not None:
            drains.append(grpc_server.drain(state.shutdown_deadline))  # every call, not connections
        await _drained(drains, hurry, state)
        ended = state.body_reads.end(state.stopping_message)  # bodies still arriving: a 503 saying so, not a bare close
        if ended:
            log.info("shutdown: %d request(s) whose body was still arriving answered 503", ended)
        await _closed(state, hurry)  # what is left gets its 503 before the connections close
        closing = [state.answers_written()]
        if grpc_server is not None:
            closing.append(grpc_server.stop(state.answers_by))
        await asyncio.gather(*closing)
    finally:
        # the signal handlers stay until the loop closes (which removes them): removed here, a
        # signal more while the models, runtime and traces closed below killed the process
        state.start_failed = not listening  # (its lifecycle then closes without a drain's lines)
        # what the drain left goes now: stalled clients, and those with no request under way, answered 503 first
        deadline = state.shutdown_deadline if state.shutdown_deadline is not None else time.monotonic()
        state.connections.close_all(deadline)
        state.trimmer.close()
        if state.tls is not None:
            state.tls.close()
        if grpc_server is not None:  # stopped already, unless serving ended otherwise or that stop was cancelled: now
            await grpc_server.stop()
        if listener is not None:
            listener.close()  # the HTTP socket; runner.cleanup() then shuts the connections down
        # until the deadline at most: the clients of those 503s read them (the exit would reset their sockets)
        await state.connections.lingering.closed_by(deadline)
        await runner.cleanup()  # (the models and the runtime closed: the line below is the last)
    if not why_stopping.device_failure:
        return 0
    log.error("exiting with status %d for a restart, which resets the device: %s", EXIT_DEVICE_FAILED,
              why_stopping.device_failure)
    return EXIT_DEVICE_FAILED
