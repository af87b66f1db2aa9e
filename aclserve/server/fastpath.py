"""The infer fast path: POST /v2/models/{m}[/versions/{v}]/infer without aiohttp's router.

Routing and the middleware chain cost about a quarter of a small request's server time, so the
runner's request handler recognises infer paths with plain string operations and calls
handle_infer directly, mapping errors exactly as error_middleware does. Every other request
(and an infer request with an Expect header, which the router's expect handler serves) goes
through the Application unchanged.
"""
from __future__ import annotations

from aiohttp import hdrs, web

_PREFIX = "/v2/models/"
_SUFFIX = "/infer"


def split_infer_path(path: str) -> tuple[str, str | None] | None:
    """'/v2/models/m/infer' -> ('m', None); '/v2/models/m/versions/2/infer' -> ('m', '2'); else None."""
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    parts = path[len(_PREFIX):-len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


def infer_fast_path(app: web.Application, fallback):
    from .app import error_response
    from .app_keys import STATE
    from .infer import handle_infer

    state = app[STATE]

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and hdrs.EXPECT not in request.headers:
            target = split_infer_path(request.path)
            if target is not None:
                try:
                    return await handle_infer(request, state, *target)
                except Exception as e:
                    return error_response(request, state, e)
        return await fallback(request)
    return handler
