"""Middlewares are one mechanism for every route: infer requests pass through the app's own
middlewares (connection tracking, errors, the API token check) and through any added later,
as every other route does. Real app, real port, real CPU runtime."""
import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from aclserve.repository import ModelRepository
from aclserve.runtime import AclRuntime
from aclserve.server.app import create_app, make_runner
from aclserve.server.app_keys import STATE

TOKEN = "middleware-test-token"
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})


async def serve_with_spy(config, seen: list):
    """The production app with one more middleware appended after create_app (innermost)."""
    @web.middleware
    async def spy(request, handler):
        seen.append((request.method, request.match_info.route.resource.canonical,
                     dict(request.match_info)))
        return await handler(request)

    runtime = AclRuntime(device="cpu")
    app = create_app(config, ModelRepository(config, runtime), runtime)
    app.middlewares.append(spy)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    await app[STATE].loading  # bound first, then loaded
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def post(session, url, path, headers=None):
    async with session.post(url + path, data=GOOD, headers=headers) as resp:
        return resp.status, await resp.json()


def test_a_middleware_added_later_sees_infer_requests(models_dir, make_config):
    seen = []

    async def scenario():
        runner, url = await serve_with_spy(make_config(models_dir), seen)
        try:
            async with aiohttp.ClientSession() as session:
                plain = await post(session, url, "/v2/models/double/infer")
                versioned = await post(session, url, "/v2/models/double/versions/1/infer")
                unknown = await post(session, url, "/v2/models/ghost/infer")
                async with session.get(url + "/v2/models/double") as resp:
                    metadata = resp.status
            return plain, versioned, unknown, metadata
        finally:
            await runner.cleanup()
    plain, versioned, unknown, metadata = asyncio.run(scenario())
    assert plain[0] == 200 and versioned[0] == 200 and metadata == 200
    assert unknown[0] == 404 and "ghost" in unknown[1]["error"]  # mapped to JSON by error_middleware
    assert seen == [
        ("POST", "/v2/models/{model}/infer", {"model": "double"}),
        ("POST", "/v2/models/{model}/versions/{version}/infer", {"model": "double", "version": "1"}),
        ("POST", "/v2/models/{model}/infer", {"model": "ghost"}),
        ("GET", "/v2/models/{model}", {"model": "double"}),
    ]


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/models/double/versions/1/infer"])
def test_the_token_check_runs_before_infer_as_a_middleware(models_dir, make_config, path):
    """auth_inference: the access middleware refuses infer before any later middleware or the
    handler runs, exactly as for the metadata route."""
    seen = []

    async def scenario():
        config = make_config(models_dir, api_token=TOKEN, auth_inference=True)
        runner, url = await serve_with_spy(config, seen)
        try:
            async with aiohttp.ClientSession() as session:
                refused = await post(session, url, path)
                allowed = await post(session, url, path, {"Authorization": f"Bearer {TOKEN}"})
            return refused, allowed
        finally:
            await runner.cleanup()
    refused, allowed = asyncio.run(scenario())
    assert refused[0] == 401 and "token" in refused[1]["error"]
    assert allowed[0] == 200
    assert len(seen) == 1  # only the request with the token got past the check
