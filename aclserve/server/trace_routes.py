"""Triton's trace extension over HTTP: GET/POST /v2[/models/{model}]/trace/setting.

POST takes the settings to change (strings, trace_level a list; null clears a model's setting
back to the global one; an empty body on a model drops the model's own settings) and answers
the settings in force, as Triton does. A bad setting is a 400 naming it.
"""
from __future__ import annotations

import orjson
from aiohttp import web

from . import views
from .app_keys import STATE
from .control_body import ControlBody

SETTINGS_BODY = ControlBody(64 * 1024, "the trace setting API's limit")


async def get_setting(request: web.Request) -> web.Response:
    doc = views.trace_settings(request.app[STATE], request.match_info.get("model"), None)
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


async def post_setting(request: web.Request) -> web.Response:
    changes = await SETTINGS_BODY.read_object(request)  # whole, within body_timeout_s
    doc = views.trace_settings(request.app[STATE], request.match_info.get("model"), changes)
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def add_trace_routes(add) -> None:
    """Register the routes with `add(method, path, handler, expect_handler)` (routes.add_routes')."""
    for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting"):
        add("GET", path, get_setting)
        add("POST", path, post_setting, SETTINGS_BODY.expect)
