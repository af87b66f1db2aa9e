"""The `Expect` request header, answered for every route the way the middlewares answer.

aiohttp runs a route's expect handler before the middlewares, and its default one raises a
417 there: a plain-text answer, and the connection tracker, which the middlewares tell when a
request ends, would keep that kept-alive connection in its head phase until header_timeout_s
closed it. So every route gets an expect handler from here: `100-continue` is answered
"100 Continue" (routes with a body first check the token and what the request's head alone
refuses, the answer the whole request would get, through continue_within: infer.expect_body,
control_body.py), anything else a JSON 417, and a request
answered here is finished with the tracker. Requests no route takes get the same
(expect_on_unmatched).
"""
from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import HttpVersion11, web
from aiohttp.web_urldispatcher import MatchInfoError, SystemRoute, UrlMappingMatchInfo

from ..errors import ServeError
from .app_keys import STATE
from .tracking import closes
from .error_responses import error_response, json_error


def unmet(request: web.Request) -> web.Response | None:
    """The 417 answer for an expectation other than 100-continue, or None. HTTP/1.0 has no
    100 Continue (the body comes anyway): nothing to answer there either."""
    if request.version != HttpVersion11:
        return None
    expect = request.headers.get("Expect", "")
    if expect.lower() == "100-continue":
        return None
    return json_error(f"unknown expectation: Expect: {expect[:100]}", 417)


async def send_continue(request: web.Request) -> web.Response | None:
    """None once "100 Continue" is written; a closing answer where the client has gone (raised
    from here, aiohttp logged a traceback for each such client and answered 500)."""
    try:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    except ConnectionError:
        response = json_error("the client closed the connection", 400)  # (nobody reads it)
        response.force_close()
        return answered(request, response)
    request.writer.output_size = 0  # as aiohttp's own handler: the answer proper has not started
    return None


def answered(request: web.Request, response: web.Response) -> web.Response:
    """`response` answers the request here, outside the middlewares: the tracker learns it ended."""
    request.app[STATE].connections.request_finished(request.transport, closes(request, response))
    return response


async def continue_within(request: web.Request, refuse: Callable[[web.Request, object], object],
                          counted: Callable[[web.Request, ServeError], Awaitable[ServeError]] | None = None
                          ) -> web.Response | None:
    """An expect handler that checks before it tells the client to send its body (aiohttp's
    own tells it at once): the route's access rule (auth.check_route: the middlewares run after
    this), then `refuse(request, state)`, which raises the ServeError the whole request would
    get where its head alone decides it (body.refuse_from_head: the Content-Encoding, the
    declared size against the route's limit and what the memory budget has left; the infer
    route adds its model and its Inference-Header-Content-Length: infer.expect_body); a refusal
    is passed to `counted` (the infer route counts it as its handler would, and answers what
    that says: 404 for an unknown model). A refusal is answered here with `Connection: close`:
    a body sent anyway is read and dropped (aiohttp's lingering, connections.BODY_LINGER_S),
    then the connection closes, and nothing sent behind it is answered (guard.py)."""
    if request.version != HttpVersion11:
        return None  # HTTP/1.0 has no 100 Continue: the body comes anyway
    refused = unmet(request)
    if refused is not None:
        return answered(request, refused)
    state = request.app[STATE]
    try:
        state.auth.check_route(request)
    except ServeError as e:  # (not counted: the handler does not count a 401 either)
        return _refuse(request, state, e)
    try:
        refuse(request, state)
    except ServeError as e:
        return _refuse(request, state, e if counted is None else await counted(request, e))
    return await send_continue(request)


def _refuse(request: web.Request, state, error: ServeError) -> web.Response:
    response = error_response(request, state, error)
    response.force_close()
    return answered(request, response)


async def expect_continue(request: web.Request) -> web.Response | None:
    """The expect handler of every route but infer."""
    refused = unmet(request)
    if refused is not None:
        return answered(request, refused)
    return await send_continue(request) if request.version == HttpVersion11 else None


class _UnmatchedRoute(SystemRoute):
    """The 404 / 405 of a request no route takes, with its Expect answered as every route's is:
    aiohttp's own handler answered a plain-text 417 outside the middlewares (the tracker kept
    the connection in its head phase), and a 500 with an ERROR traceback when the header held a
    byte that is not UTF-8 (aiohttp decodes it to a lone surrogate its 417 cannot encode)."""

    async def handle_expect_header(self, request: web.Request) -> web.Response | None:
        return await expect_continue(request)


class _Unmatched(MatchInfoError):
    __slots__ = ()

    def __init__(self, exception: web.HTTPException) -> None:
        self._exception = exception
        UrlMappingMatchInfo.__init__(self, {}, _UnmatchedRoute(exception))


def expect_on_unmatched(router: web.UrlDispatcher) -> None:
    """Give the requests no route takes (404, 405) the expect handling of the routes."""
    resolve = router.resolve

    async def resolved(request: web.Request):
        match = await resolve(request)
        if type(match) is MatchInfoError and "Expect" in request.headers:
            return _Unmatched(match.http_exception)
        return match
    router.resolve = resolved
