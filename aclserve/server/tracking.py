"""The app's outermost middleware (tracking_middleware): the connection tracker (connections.py)
learns when each request aiohttp runs starts and ends, a connection opened during the shutdown
drain is answered what it may ask (GET and HEAD /metrics; an infer request is refused by the infer
path itself, which logs it), and every answer made during the drain says `Connection: close`, as
does the answer to a probe on a connection taken over max_connections (spare_places.py: the
connection guard hands aiohttp nothing else on it). Loop thread only."""
from __future__ import annotations

from aiohttp import web

from .connections import ConnectionTracker
from .error_responses import json_error

SCRAPE_PATH = "/metrics"  # what a connection opened during the drain is answered
INFER_SUFFIX = "/infer"  # the infer routes' (routes.py): refused on such a connection by the infer path


def tracking_middleware(tracker: ConnectionTracker):
    """The app's outermost middleware: the tracker sees when each request starts and ends (a
    connection running one is neither evicted nor timed out), a connection opened during the drain is
    answered GET and HEAD /metrics alone, and answers made during it say `Connection: close` (RFC 9112
    9.6)."""
    @web.middleware
    async def track(request: web.Request, handler) -> web.StreamResponse:
        transport = request.transport
        tracker.request_started(transport)
        response = None
        try:
            if tracker.late(transport) and not _taken_late(request):
                return _closing(tracker.stopping_message())
            response = await handler(request)
            # during the drain a pooled client sends its next request elsewhere; a spare place is freed
            if not tracker.accepting or tracker.over(transport):
                response.force_close()
            if response.compression:
                # aiohttp compresses a large body in a thread when it prepares the answer, after
                # this: done here, the request still counts until its answer is written (the
                # guard must not write an early refusal before it); headers are written with the body
                await response.prepare(request)
            return response
        finally:
            tracker.request_finished(transport, closes=closes(request, response))
    return track


def _taken_late(request: web.Request) -> bool:
    """What a connection opened during the drain is not refused here: GET and HEAD /metrics, and an
    infer request, which the infer path refuses itself (503 "server is shutting down", or why a failed device
    stops the server, as on a connection opened before), with its request log line; answered here, it had none."""
    if request.method in ("GET", "HEAD"):
        return request.path == SCRAPE_PATH
    resource = request.match_info.route.resource
    return request.method == "POST" and resource is not None and resource.canonical.endswith(INFER_SUFFIX)


def closes(request: web.BaseRequest, response: web.StreamResponse | None) -> bool:
    """Whether `response` closes its connection: forced so, or the request's own head asked for
    it (aiohttp's keep_alive is None until the answer is prepared). None: no answer was made here."""
    return response is not None and (response.keep_alive is False or not request.keep_alive)


def _closing(message: str) -> web.Response:
    """A connection opened during the drain asked for more than /metrics: answered as the tracker answers
    once the drain has ended (ConnectionTracker.closing_answer: the same body, `message`, and Retry-After),
    closed."""
    response = json_error(message, 503, retry_after=1)
    response.force_close()
    return response
