"""Triton's trace extension over HTTP: GET/POST /v2[/models/{model}]/trace/setting.

POST takes the settings to change (strings, trace_level a list; null clears a model's setting
back to the global one; an empty body on a model drops the model's own settings) and answers
the settings in force, as Triton does. A bad setting is a 400 naming it.
"""
from __future__ import annotations

import orjson
from aiohttp import web

from ..errors import InvalidInput
from . import views
from .app_keys import STATE
from .body import body_limit, read_body

MAX_BODY = 64 * 1024


async def get_setting(request: web.Request) -> web.Response:
    doc = views.trace_settings(request.app[STATE], request.match_info.get("model"), None)
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


async def post_setting(request: web.Request) -> web.Response:
    state = request.app[STATE]
    config = state.config
    changes: dict = {}
    with state.budget.lease() as lease:  # the whole body (not what has come so far), within body_timeout_s
        limit, name = body_limit(config.max_body_bytes, MAX_BODY, "the trace setting API's limit")
        raw = await read_body(request, lease, limit, config.body_timeout_s, state.body_reads, name)
        if raw.strip():
            try:
                changes = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(changes, dict):
        raise InvalidInput("request body must be a JSON object")
    doc = views.trace_settings(state, request.match_info.get("model"), changes)
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def add_trace_routes(add) -> None:
    """Register the routes with `add(method, path, handler)` (routes.add_routes')."""
    for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting"):
        add("GET", path, get_setting)
        add("POST", path, post_setting)
