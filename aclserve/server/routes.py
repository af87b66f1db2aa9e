"""KServe v2 routes other than infer: health, metadata, config, repository, statistics, metrics.

Every answer is JSON (errors too, via the app's middleware); success is always 200 because
tritonclient treats any other status as an error (reference §2).
"""
from __future__ import annotations

import asyncio

import json

from aiohttp import web

from .. import __version__
from ..errors import InvalidInput, NotFound, ServeError
from .app_keys import STATE
from .infer import infer
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .model_info import model_config, model_metadata

EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository",
              "schedule_policy", "statistics"]


def _json(doc, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type="application/json")


def _version_key(version: str):
    return (0, int(version)) if version.isdigit() else (1, version)


async def health_live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def health_ready(request: web.Request) -> web.Response:
    ready = request.app[STATE].ready()
    return _json({"ready": ready}, 200 if ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "aclserve", "version": __version__, "extensions": EXTENSIONS})


def _served(request: web.Request):
    match = request.match_info
    return request.app[STATE].repo.get(match["model"], match.get("version"))


async def get_model_metadata(request: web.Request) -> web.Response:
    served = _served(request)
    versions = sorted((v for _, v in request.app[STATE].ready_versions(served.name)), key=_version_key)
    return _json(model_metadata(served, versions or [str(served.version)]))


async def model_ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    match = request.match_info
    name = match["model"]
    try:
        state.repo.get(name, match.get("version"))
    except NotFound:
        raise
    except ServeError:  # known but not serving (loading, failed, draining)
        return _json({"name": name, "ready": False}, 503)
    ready = not state.shutting_down
    return _json({"name": name, "ready": ready}, 200 if ready else 503)


async def get_model_config(request: web.Request) -> web.Response:
    return _json(model_config(_served(request)))


async def _body(request: web.Request) -> dict:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    return doc


async def repository_index(request: web.Request) -> web.Response:
    doc = await _body(request)
    ready_only = doc.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput("ready must be a boolean")
    entries = request.app[STATE].repo.index(ready_only=ready_only)
    return _json([{"name": e["name"], "version": str(e.get("version", "")), "state": e.get("state", ""),
                   "reason": e.get("reason", "") or ""} for e in entries])


async def repository_load(request: web.Request) -> web.Response:
    doc = await _body(request)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("parameters must be an object")
    if any(k == "config" or k.startswith("file:") for k in params):
        raise InvalidInput("loading with a config override or uploaded files is not supported; "
                           "put the model in the repository folder")
    name = request.match_info["model"]
    await request.app[STATE].repo.load(name)
    return _json({"name": name, "load": True})


async def repository_unload(request: web.Request) -> web.Response:
    await _body(request)  # {"parameters": {"unload_dependents": false}}: no dependents here
    name = request.match_info["model"]
    await request.app[STATE].repo.unload(name)
    return _json({"name": name, "unload": True})


async def statistics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    match = request.match_info
    name, version = match.get("model"), match.get("version")
    if name is None:
        pairs = state.ready_versions()
    elif version is None:
        served = state.repo.get(name)  # NotFound for an unknown model
        pairs = state.ready_versions(name) or [(name, str(served.version))]
    else:
        served = state.repo.get(name, version)
        pairs = [(name, str(served.version))]
    stats = []
    for model, ver in sorted(pairs, key=lambda p: (p[0], _version_key(p[1]))):
        try:
            served = state.repo.get(model, ver)
        except Exception:
            continue
        entry = {"name": model, "version": ver}
        entry.update(served.batcher.stats.kserve())
        entry.setdefault("response_stats", {})
        entry.setdefault("memory_usage", [])
        stats.append(entry)
    return _json({"model_stats": stats})


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    # Device memory is read through ACL, which must not run on the event loop: refresh the
    # cached figures in a worker thread, then render from the cache.
    await asyncio.get_running_loop().run_in_executor(None, state.refresh_memory)
    body = state.metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def unsupported_extension(request: web.Request) -> web.Response:
    raise InvalidInput(f"{request.path}: this extension is not supported by aclserve")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v2/health/live", health_live)
    r.add_get("/v2/health/ready", health_ready)
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/", server_metadata)
    r.add_get("/v2/models/stats", statistics)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, get_model_metadata)
        r.add_get(base + "/ready", model_ready)
        r.add_get(base + "/config", get_model_config)
        r.add_get(base + "/stats", statistics)
        r.add_post(base + "/infer", infer)
    r.add_post("/v2/repository/index", repository_index)
    r.add_post("/v2/repository/models/{model}/load", repository_load)
    r.add_post("/v2/repository/models/{model}/unload", repository_unload)
    for prefix in ("/v2/systemsharedmemory", "/v2/cudasharedmemory", "/v2/trace", "/v2/logging"):
        r.add_route("*", prefix + "{tail:.*}", unsupported_extension)
    r.add_get("/metrics", metrics)
