"""The aiohttp application and its ordered lifecycle.

Start: runtime (acl.init, devices), then repository (scan, load, warm up, watch), then the
caller starts listening (HTTP, then gRPC in `serve`). Stop (SIGTERM/SIGINT in `serve`):
readiness turns false and new infer requests get 503 / UNAVAILABLE at once; queued and
in-flight requests of both transports get `shutdown_timeout_s` to finish; then the gRPC
port and the HTTP socket close, the repository drains and unloads every model, and the
runtime destroys contexts, resets devices and finalizes ACL, in that order.
"""
from __future__ import annotations

import asyncio
import logging
import signal

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..errors import ServeError
from .app_keys import STATE
from .fastpath import infer_fast_path
from .routes import add_routes
from .state import ServerState

log = logging.getLogger(__name__)


def json_error(message: str, status: int, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": str(max(1, int(round(retry_after))))} if retry_after else None
    return web.Response(body=orjson.dumps({"error": message}), status=status,
                        content_type="application/json", headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """ServeError -> {"error": message} with its status; aiohttp's own HTTP errors (404 route,
    405, 413) -> the same JSON shape; anything else -> logged, generic 500."""
    try:
        return await handler(request)
    except Exception as e:
        return error_response(request, request.app.get(STATE), e)


def error_response(request: web.Request, state: ServerState | None, exc: Exception) -> web.Response:
    """The JSON error answer for `exc`; re-raises what is not an error (e.g. a 3xx HTTPException)."""
    try:
        raise exc
    except ServeError as e:
        return json_error(e.message, e.status, e.retry_after)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if isinstance(e, web.HTTPRequestEntityTooLarge):
            limit = f"{state.config.max_body_bytes} bytes" if state is not None else "the configured size"
            message = f"request body exceeds the limit of {limit} (max_body_bytes)"
        elif isinstance(e, web.HTTPNotFound):
            message = f"no route for {request.method} {request.path}"
        elif isinstance(e, web.HTTPMethodNotAllowed):
            message = f"method {request.method} is not allowed on {request.path}"
        else:
            message = e.reason
        return json_error(message, e.status)
    except (HttpProcessingError, web.RequestPayloadError) as e:  # unreadable body, e.g. bad gzip
        cause = e.__cause__ if isinstance(e, web.RequestPayloadError) and e.__cause__ else e
        detail = getattr(cause, "message", "") or str(cause) or type(cause).__name__
        return json_error(f"request body could not be read: {detail.strip()}", 400)
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return json_error("internal error", 500)


async def _lifecycle(app: web.Application):
    state = app[STATE]
    state.runtime.start()
    try:
        add_listener = getattr(state.repo, "add_listener", None)
        if add_listener is not None:
            add_listener(state.metrics.on_repository_event)
        await state.repo.start()
    except BaseException:
        state.runtime.close()
        raise
    state.started = True
    try:
        yield
    finally:
        await state.begin_shutdown()
        try:
            await state.repo.close()
        finally:
            state.started = False
            # the traces still waiting are written (blocking file I/O, off the loop)
            await asyncio.get_running_loop().run_in_executor(None, state.tracer.close)
            state.runtime.close()
            log.info("runtime closed")


def create_app(config, repo, runtime) -> web.Application:
    """The KServe v2 app. Starting it (AppRunner.setup / test client) starts `runtime`, then
    `repo`; cleaning it up drains and closes them in reverse order."""
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    app[STATE] = ServerState(config, repo, runtime)
    add_routes(app)
    app.cleanup_ctx.append(_lifecycle)
    return app


class KServeRunner(web.AppRunner):
    """AppRunner whose server sends POST .../infer straight to the infer handler (see fastpath)."""

    async def setup(self) -> None:
        await super().setup()
        self.server.request_handler = infer_fast_path(self.app, self.server.request_handler)


def make_runner(app: web.Application, access_log: bool = False) -> web.AppRunner:
    # handler_cancellation: a client that disconnects cancels its handler, which removes the
    # request from the batch queue (run_app/AppRunner leave it off by default).
    kwargs = {} if access_log else {"access_log": None}
    return KServeRunner(app, handler_cancellation=True, shutdown_timeout=5.0, **kwargs)


async def serve(config, runtime=None, repo=None, started: asyncio.Future | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set), then shut down in order. `started` gets the
    bound (host, port) once listening."""
    from ..repository import ModelRepository
    from ..runtime import AclRuntime

    if runtime is None:
        runtime = AclRuntime(device=config.device, cpu_threads=config.cpu_threads,
                             memory_reserve_fraction=config.memory_reserve_fraction,
                             device_limits=config.device_limits)
    if repo is None:
        repo = ModelRepository(config, runtime)
    app = create_app(config, repo, runtime)
    runner = make_runner(app, access_log=config.log_level == "debug")
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
            pass
    grpc_server = None
    drain_deadline = None
    try:
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        log.info("aclserve listening on http://%s:%d", host, port)
        if config.grpc_port:
            from .grpc_server import GrpcServer  # grpc is imported only when the endpoint is on
            grpc_server = GrpcServer(app[STATE], config.max_body_bytes)
            grpc_port = await grpc_server.start(config.host, config.grpc_port)
            log.info("aclserve gRPC listening on %s:%d", config.host, grpc_port)
        if started is not None and not started.done():
            started.set_result((host, port))
        await stop.wait()
        log.info("signal received: draining")
        drain_deadline = loop.time() + config.shutdown_timeout_s
        await app[STATE].begin_shutdown()  # HTTP and gRPC requests alike
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        if grpc_server is not None:  # in-flight RPCs are done or out of time: close the port
            grace = 0.0 if drain_deadline is None else max(0.0, drain_deadline - loop.time())
            await grpc_server.stop(grace)
        await runner.cleanup()
