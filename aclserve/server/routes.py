"""KServe v2 routes: infer (infer.py), health, metadata, config, repository, statistics, metrics.

Every answer is JSON (errors too, via the app's middleware); success is always 200 because
tritonclient.http treats any other status as an error (it raises InferenceServerException).
"""
from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from ..errors import InvalidInput
from . import views
from .answer_coding import COMPRESS_MIN_BYTES, answer_coding
from .app_keys import STATE
from .control_body import ControlBody
from .expect import expect_continue, expect_on_unmatched
from .exposition import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .infer import expect_body, infer
from .trace_routes import add_trace_routes

REPOSITORY_BODY = ControlBody(1 << 20, "the repository API's limit")  # a few bytes of JSON


def _json(doc, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


async def health_live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def health_ready(request: web.Request) -> web.Response:
    ready = request.app[STATE].ready()
    return _json({"ready": ready}, 200 if ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json(views.server_metadata())


def _target(request: web.Request) -> tuple[str, str | None]:
    match = request.match_info
    return match["model"], match.get("version")


async def get_model_metadata(request: web.Request) -> web.Response:
    return _json(views.metadata(request.app[STATE], *_target(request)))


async def model_ready(request: web.Request) -> web.Response:
    name, version = _target(request)
    ready = views.model_ready(request.app[STATE], name, version)
    return _json({"name": name, "ready": ready}, 200 if ready else 503)


async def get_model_config(request: web.Request) -> web.Response:
    return _json(views.config(request.app[STATE], *_target(request)))


async def _body(request: web.Request) -> dict:
    return await REPOSITORY_BODY.read_object(request)


async def repository_index(request: web.Request) -> web.Response:
    doc = await _body(request)
    ready_only = doc.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput("ready must be a boolean")
    return _json(await views.repository_index(request.app[STATE], ready_only))


def _parameters(doc: dict) -> dict:
    """A repository request's "parameters": an object, or absent (null: absent); `[]` was taken."""
    params = doc.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInput("parameters must be an object")
    return params


async def repository_load(request: web.Request) -> web.Response:
    state = request.app[STATE]
    with state.control_calls.held():  # (answered before the shutdown closes its connection)
        views.check_load_parameters(_parameters(await _body(request)))
        name = request.match_info["model"]
        await state.repo.load(name)
        return _json({"name": name, "load": True})


async def repository_unload(request: web.Request) -> web.Response:
    state = request.app[STATE]
    with state.control_calls.held():
        dependents = _parameters(await _body(request)).get("unload_dependents", False)
        if not isinstance(dependents, bool):  # (no dependents here: its value changes nothing)
            raise InvalidInput("parameters.unload_dependents must be a boolean")
        name = request.match_info["model"]
        await state.repo.unload(name)
        return _json({"name": name, "unload": True})


async def named_repository(request: web.Request) -> web.Response:
    """A load or unload naming a repository: one is served, refused as Triton refuses it (400)."""
    raise InvalidInput(views.NAMED_REPOSITORY)


async def statistics(request: web.Request) -> web.Response:
    match = request.match_info
    return _json(views.statistics(request.app[STATE], match.get("model"), match.get("version")))


async def metrics(request: web.Request) -> web.Response:
    # the text is taken off the event loop but for the figures' copy, in steps (scrape_text.py), and
    # shared with the scrapes that come meanwhile
    text = await request.app[STATE].scrapes.text()
    accepted = request.headers.get("Accept-Encoding")
    coding = answer_coding(accepted) if accepted else None  # (Prometheus asks for gzip)
    headers = {"Content-Type": METRICS_CONTENT_TYPE, "Vary": "Accept-Encoding"}  # (for a cache between)
    if coding is None or len(text.body) < COMPRESS_MIN_BYTES:
        return web.Response(body=text.body, headers=headers)
    body = await asyncio.get_running_loop().run_in_executor(None, text.coded, coding)
    return web.Response(body=body, headers=dict(headers, **{"Content-Encoding": coding.value}))


# the routes of the extensions not offered, each refused naming its own (views.not_offered)
NOT_OFFERED_ROUTES = {"/v2/systemsharedmemory": "system_shared_memory", "/v2/cudasharedmemory": "cuda_shared_memory",
                      "/v2/logging": "logging"}
# Triton's generate extension, of a model (its routes answered 404 "no route", the others' 400 naming them)
GENERATE_ACTIONS = ("/generate", "/generate_stream")


def unsupported_extension(extension: str):
    """The handler of every route under one of NOT_OFFERED_ROUTES (and of GENERATE_ACTIONS): a 400
    naming the path."""
    refusal = views.not_offered(extension)

    async def refuse(request: web.Request) -> web.Response:
        raise InvalidInput(f"{request.path}: {refusal}")
    return refuse


MODEL_BASES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")


def add_routes(app: web.Application) -> None:
    router = app.router

    def add(method: str, path: str, handler, expect_handler=expect_continue) -> None:
        if method == "GET":  # add_get also answers HEAD
            router.add_get(path, handler, expect_handler=expect_handler)  # expect.py says why
        else:
            router.add_route(method, path, handler, expect_handler=expect_handler)

    # Infer first: aiohttp tries the templates that share a prefix in the order they were
    # added, so the hot path matches on its first (unversioned) or second try instead of after
    # the other model routes (measured: a lookup takes 2 us instead of 4, versioned 3 instead of 8).
    for base in MODEL_BASES:
        add("POST", base + "/infer", infer, expect_body)
    add("GET", "/v2/health/live", health_live)
    add("GET", "/v2/health/ready", health_ready)
    add("GET", "/v2", server_metadata)
    add("GET", "/v2/", server_metadata)
    add("GET", "/v2/models/stats", statistics)
    for base in MODEL_BASES:
        add("GET", base, get_model_metadata)
        add("GET", base + "/ready", model_ready)
        add("GET", base + "/config", get_model_config)
        add("GET", base + "/stats", statistics)
    add("POST", "/v2/repository/index", repository_index, REPOSITORY_BODY.expect)
    # the index naming a repository: Triton's HTTP server takes the name and ignores it (its gRPC refuses it)
    add("POST", "/v2/repository/{repository}/index", repository_index, REPOSITORY_BODY.expect)
    add("POST", "/v2/repository/models/{model}/load", repository_load, REPOSITORY_BODY.expect)
    add("POST", "/v2/repository/models/{model}/unload", repository_unload, REPOSITORY_BODY.expect)
    for action in ("load", "unload"):  # (auth.py checks these as load/unload: the template's prefix)
        add("POST", "/v2/repository/{repository}/models/{model}/" + action, named_repository, REPOSITORY_BODY.expect)
    add_trace_routes(add)
    for prefix, extension in NOT_OFFERED_ROUTES.items():
        add("*", prefix + "{tail:.*}", unsupported_extension(extension))
    for base in MODEL_BASES:
        for action in GENERATE_ACTIONS:
            add("*", base + action, unsupported_extension("generate"))
    add("GET", "/metrics", metrics)
    expect_on_unmatched(router)  # (after the routes: a request none of them takes)
