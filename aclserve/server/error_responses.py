"""Errors as HTTP answers: every error a route raises becomes {"error": message} with its
status (http_errors.py's table), aiohttp's own HTTP errors take the same shape, a MemoryError is
the host short of memory (503: host_memory.py), and anything else is logged and answered a
generic 500 (no traceback reaches a client). An overload refusal
holds its connection for its Retry-After (connections.py)."""
from __future__ import annotations

import logging
import math
import re
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..errors import Overloaded, PayloadTooLarge, ServeError
from ..logs import surrogates_escaped
from .app_keys import STATE
from .body import BodyOverBudget, BodyTimeout
from .host_memory import HostOutOfMemory, host_out_of_memory
from .http_errors import error_headers, http_status, retry_after
from .views import EMPTY_MODEL_NAME

if TYPE_CHECKING:
    from .state import ServerState

log = logging.getLogger(__name__)


def error_body(message: str) -> bytes:
    """{"error": message} as JSON. A message may quote a header, which aiohttp decodes as UTF-8
    with surrogateescape: a byte that is not UTF-8 becomes a lone surrogate, which orjson
    refuses to write (`Expect: \\xff` was a 500 with an ERROR traceback); it is written escaped."""
    try:
        return orjson.dumps({"error": message})
    except orjson.JSONEncodeError:
        return orjson.dumps({"error": surrogates_escaped(message)})


V2_HINT = "use /v2/models/{model}/infer, with the KServe SDK RESTConfig(protocol='v2')"
# a model route whose model is empty ("/v2/models//ready"): no route takes it, and it is the
# request's fault, as gRPC's INVALID_ARGUMENT for an empty model name says (and Triton's HTTP 400)
_EMPTY_MODEL = re.compile(r"/v2/(repository/)?models//|/v2/models/$")


def json_error(message: str, status: int, retry_after: float | None = None,
               headers: dict | None = None) -> web.Response:
    headers = dict(headers or {})
    if retry_after:
        headers["Retry-After"] = retry_after_value(retry_after)
    return web.Response(body=error_body(message), status=status,
                        content_type="application/json", headers=headers or None)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """ServeError -> {"error": message} with its status; aiohttp's own HTTP errors (404 route,
    405, 413) -> the same JSON shape; anything else -> logged, generic 500."""
    try:
        return await handler(request)
    except Exception as e:
        return error_response(request, request.app.get(STATE), e)


def error_response(request: web.Request, state: ServerState | None, exc: Exception) -> web.Response:
    """The JSON error answer for `exc`; re-raises what is not an error (e.g. a 3xx HTTPException).

    Dispatches with isinstance, not by re-raising: a re-raise here would put this frame (which
    holds `exc`) in exc's own traceback, a cycle that keeps the failed request's frames and
    their buffers (a whole request body) alive until the cyclic GC happens to run."""
    try:
        return _error_response(request, state, exc)
    finally:
        exc.__traceback__ = None  # answered (and logged if internal): let its frames go now


def serve_error_parts(state: ServerState | None, exc: ServeError, transport, body_pending: bool
                      ) -> tuple[int, str, float | None, dict]:
    """(status, message, Retry-After seconds or None, extra headers) of a ServeError's answer,
    for both HTTP paths (aiohttp's, and the guard's own: direct.py). An overload refusal tells
    the connection tracker (early refusals, holds), which gives its Retry-After."""
    message = state.redact(exc.message) if state is not None else exc.message
    wait = retry_after(exc)
    if isinstance(exc, Overloaded) and state is not None:
        wait = state.connections.refused_for_room(transport, body_pending=body_pending)
    return http_status(exc), message, wait, error_headers(exc)


def retry_after_value(seconds: float) -> str:
    """Whole seconds, rounded up (a load's retry due in 1.4 s is not there after 1 s)."""
    return str(max(1, math.ceil(seconds)))


def _error_response(request: web.Request, state: ServerState | None, exc: Exception) -> web.Response:
    if isinstance(exc, MemoryError):  # the host short of memory: 503, one WARNING line (host_memory.py)
        exc = host_out_of_memory(exc, f"{request.method} {request.path}")
    if isinstance(exc, ServeError):
        pending = not request.content.is_eof()
        status, message, wait, headers = serve_error_parts(state, exc, request.transport, body_pending=pending)
        response = json_error(message, status, wait, headers)
        if isinstance(exc, BodyTimeout):
            # the client stalled: closed after this answer (aiohttp first reads and drops what still
            # comes of the body for BODY_LINGER_S at most, so that the client sees the 408: app.py)
            response.force_close()
        elif pending and isinstance(exc, (PayloadTooLarge, HostOutOfMemory)):
            # a body over a limit, or that memory ran out for, refused before all of it came: its
            # rest is read and dropped (BODY_LINGER_S, so that the client sees this answer), then the
            # connection closes, as nginx closes after its 413; said in `Connection: close` (it
            # closed without a word)
            response.force_close()
        elif isinstance(exc, BodyOverBudget):
            response.force_close()  # refused halfway through its body: a new connection for the retry
        return response
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            limit = f"{state.config.max_body_bytes} bytes" if state is not None else "the configured size"
            message = f"request body exceeds the limit of {limit} (max_body_bytes)"
        elif isinstance(exc, web.HTTPNotFound) and _EMPTY_MODEL.match(request.path):
            return json_error(f"{EMPTY_MODEL_NAME} ({request.method} {request.path})", 400)
        elif isinstance(exc, web.HTTPNotFound):
            # (CONNECT's target is an authority, `h:443`: its path is empty)
            message = f"no route for {request.method} {request.path or request.raw_path}"
            if request.path.startswith("/v1/") or request.path in ("/", "/v1"):  # (the KServe SDK's default)
                message += f" (the KServe v1 protocol is not served: {V2_HINT})"
        elif isinstance(exc, web.HTTPMethodNotAllowed):
            message = f"method {request.method} is not allowed on {request.path}"
            # RFC 9110 15.5.6: a 405 MUST carry Allow (aiohttp's exception has it; keep it)
            return json_error(message, exc.status, headers={"Allow": exc.headers["Allow"]})
        else:
            message = exc.reason
        return json_error(message, exc.status)
    if isinstance(exc, (HttpProcessingError, web.RequestPayloadError)):  # unreadable body
        cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) and exc.__cause__ else exc
        detail = getattr(cause, "message", "") or str(cause) or type(cause).__name__
        return json_error(f"request body could not be read: {detail.strip()}", 400)
    log.error("internal error on %s %s", request.method, request.path, exc_info=exc)  # (logs.py escapes a newline)
    return json_error("internal error", 500)
