"""A model whose load is asked through the repository API is LOADING to every client from the
call on, while the call still reads the models folder: infer 503 with Retry-After, its /ready and
the server's 503 (explicit mode: readiness waits for the models asked), the index and the
model_state gauge (they said "UNAVAILABLE: unloaded": an operator's tester polling a model after
asking for its load). Real app on a real port, real CPU runtime; the folder's read is held by
an event (another load's scan of a large folder, say). The repository API's index reads the folder
itself in explicit mode, after the read running: asked meanwhile, it answers once the load has
begun; the rows it is made of (/metrics' gauge reads them) say LOADING throughout."""
from __future__ import annotations

import asyncio
import json
import re
import shutil

import aiohttp
import pytest
from aiohttp import web

from aclserve.repository import ModelRepository
from aclserve.runtime import AclRuntime
from aclserve.server.app import create_app, make_runner
from aclserve.server.app_keys import STATE

from tests.repository.repo_helpers import folder_reads_held, place

GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
LOADING = "load asked through the repository API: reading the models folder"


async def answer(session, method: str, url: str, data: str | None = None) -> tuple[int, dict, str]:
    async with session.request(method, url, data=data) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def arrived(repo, name: str) -> None:
    """Until the load call of `name` has reached the repository."""
    while not repo._calls.loading(name):
        await asyncio.sleep(0.01)


def model_state(metrics: str, state: str) -> float:
    found = re.search(r'^aclserve_model_state\{model="double",state="%s",version="1"\} (\S+)$' % state, metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def serving(config):
    """The real app on a free port, its startup loads done: its repository, runner and URL."""
    runtime = AclRuntime(device="cpu")
    repo = ModelRepository(config, runtime)
    app = create_app(config, repo, runtime)
    runner = make_runner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    await app[STATE].loading
    host, port = runner.addresses[0][:2]
    return repo, runner, f"http://{host}:{port}"


def test_a_model_is_loading_to_every_client_while_its_load_call_reads_the_folder(models_dir, make_config):
    async def scenario():
        config = make_config(models_dir, readiness="strict")  # (explicit mode)
        repo, runner, url = await serving(config)
        try:
            async with aiohttp.ClientSession() as session:
                assert (await answer(session, "POST", url + "/v2/repository/models/double/unload"))[0] == 200
                with folder_reads_held(repo) as reading:  # the load call's read, held until the checks are done
                    load = asyncio.ensure_future(answer(session, "POST", url + "/v2/repository/models/double/load"))
                    await asyncio.wait_for(reading.wait(), 30)  # a hang guard
                    seen = {
                        "infer": await answer(session, "POST", url + "/v2/models/double/infer", GOOD),
                        "model ready": (await answer(session, "GET", url + "/v2/models/double/ready"))[0],
                        "server ready": (await answer(session, "GET", url + "/v2/health/ready"))[0],
                        "rows": repo.index(),
                        "metrics": (await answer(session, "GET", url + "/metrics"))[2],
                    }
                    index = asyncio.ensure_future(answer(session, "POST", url + "/v2/repository/index", "{}"))
                seen["index"] = json.loads((await index)[2])
                loaded = await load
                after = await answer(session, "POST", url + "/v2/models/double/infer", GOOD)
            return seen, loaded, after
        finally:
            await runner.cleanup()

    seen, loaded, after = asyncio.run(scenario())
    status, headers, body = seen["infer"]
    assert status == 503 and headers.get("Retry-After") == "1", (status, headers)
    assert json.loads(body) == {"error": f"model double is not ready (LOADING: {LOADING})"}
    assert seen["model ready"] == 503 and seen["server ready"] == 503
    row = next(r for r in seen["rows"] if r["name"] == "double")
    assert (row["state"], row["reason"]) == ("LOADING", LOADING)
    row = next(r for r in seen["index"] if r["name"] == "double")
    assert row["state"] in ("LOADING", "READY"), row  # (its load has begun, or is done)
    assert model_state(seen["metrics"], "LOADING") == 1 and model_state(seen["metrics"], "UNAVAILABLE") == 0
    assert loaded[0] == 200 and after[0] == 200


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_the_server_is_not_ready_while_a_load_call_reads_the_folder_for_a_model_copied_in_since(
        models_dir, tmp_path, make_config, mode):
    """Readiness counted the models of the folder's last listing (explicit: of those asked): a model
    copied in since, named by a load call, was in none until that call's read ended, and
    /v2/health/ready said 200 meanwhile (in poll mode until the watcher's scan). Its call asks for
    it: the server is not ready until it serves."""
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")

    async def scenario():
        config = make_config(tmp_path, readiness="strict", model_control_mode=mode, settle_s=0.0)
        repo, runner, url = await serving(config)
        try:
            async with aiohttp.ClientSession() as session:
                before = (await answer(session, "GET", url + "/v2/health/ready"))[0]
                with folder_reads_held(repo) as reading:  # every read of the folder (the load call's, the watcher's)
                    place(models_dir / "affine.om", tmp_path / "new.om")
                    load = asyncio.ensure_future(answer(session, "POST", url + "/v2/repository/models/new/load"))
                    await asyncio.wait_for(reading.wait(), 30)  # a hang guard
                    await asyncio.wait_for(arrived(repo, "new"), 30)  # (poll mode: the watcher's read may come first)
                    reading_ready = (await answer(session, "GET", url + "/v2/health/ready"))[0]
                loaded = (await load)[0]
                after = (await answer(session, "GET", url + "/v2/health/ready"))[0]
            return before, reading_ready, loaded, after
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == (200, 503, 200, 200)


def grpc_affine_request(model: str):
    from tritonclient.grpc import service_pb2 as pb
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    request.inputs.add(name="idx", datatype="INT64", shape=[1, 3])
    request.raw_input_contents.extend([bytes(4 * 8), bytes(8 * 3)])
    return request


async def grpc_answers(port: int, model: str) -> tuple[bool, tuple[str, str]]:
    """(ModelReady's ready, ModelInfer's (status code's name, details)) for `model` over gRPC."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        ready = (await stub.ModelReady(pb.ModelReadyRequest(name=model))).ready
        try:
            await stub.ModelInfer(grpc_affine_request(model))
            return ready, ("OK", "")
        except grpc.aio.AioRpcError as e:
            return ready, (e.code().name, e.details())


async def client_view(session, url: str, grpc_port: int, model: str) -> dict:
    """What clients are told of `model`: its /ready, an infer, its gRPC ModelReady and ModelInfer."""
    ready_status, _, ready_body = await answer(session, "GET", f"{url}/v2/models/{model}/ready")
    infer_status, headers, infer_body = await answer(session, "POST", f"{url}/v2/models/{model}/infer", AFFINE)
    grpc_ready, grpc_infer = await grpc_answers(grpc_port, model)
    return {"ready": (ready_status, json.loads(ready_body)), "infer": (infer_status, json.loads(infer_body)),
            "retry after": headers.get("Retry-After"), "grpc ready": grpc_ready, "grpc infer": grpc_infer}


AFFINE = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [0, 1, 2]}]})


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_a_model_no_listing_knows_is_loading_while_its_load_call_reads_the_folder(
        models_dir, tmp_path, make_config, mode):
    """A model copied in since the last listing, named by a load call: while the call reads the folder
    (the server's readiness already waits for it), its /ready, infer (HTTP and gRPC) and the index
    answered as for a model that does not exist (404, NOT_FOUND, no row). It is LOADING, as a
    known version loading is: /ready 503, infer 503 with Retry-After (gRPC UNAVAILABLE), ModelReady
    false, a LOADING row of the model's own (no version known yet) that is no load failure. Then it
    serves. (Triton answers its model ready alike for a model unknown and one loading.)"""
    from aclserve.server.grpc_server import GrpcServer

    async def scenario():
        config = make_config(tmp_path, model_control_mode=mode, settle_s=0.0)
        repo, runner, url = await serving(config)
        grpc_server = GrpcServer(runner.app[STATE], config.max_body_bytes)
        grpc_port = await grpc_server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                with folder_reads_held(repo) as reading:  # every read of the folder (the load call's, the watcher's)
                    place(models_dir / "affine.om", tmp_path / "new.om")
                    load = asyncio.ensure_future(answer(session, "POST", url + "/v2/repository/models/new/load"))
                    await asyncio.wait_for(reading.wait(), 30)  # a hang guard
                    await asyncio.wait_for(arrived(repo, "new"), 30)  # (poll mode: the watcher's read may come first)
                    seen = await client_view(session, url, grpc_port, "new")
                    seen["rows"] = [row for row in repo.index() if row["name"] == "new"]
                    seen["metrics"] = (await answer(session, "GET", url + "/metrics"))[2]
                    # (explicit mode: the API's index reads the folder first, after the load's read)
                    if mode == "poll":
                        index = json.loads((await answer(session, "POST", url + "/v2/repository/index", "{}"))[2])
                        seen["index"] = [row for row in index if row["name"] == "new"]
                loaded = (await load)[0]
                after = await client_view(session, url, grpc_port, "new")
            return seen, loaded, after
        finally:
            await grpc_server.stop()
            await runner.cleanup()

    seen, loaded, after = asyncio.run(scenario())
    assert seen["ready"] == (503, {"name": "new", "ready": False})
    assert seen["infer"] == (503, {"error": f"model new is not ready (LOADING: {LOADING})"})
    assert seen["retry after"] == "1" and seen["grpc ready"] is False
    assert seen["grpc infer"] == ("UNAVAILABLE", f"model new is not ready (LOADING: {LOADING})")
    assert seen["rows"] == [{"name": "new", "version": "", "state": "LOADING", "reason": LOADING}]
    assert seen.get("index", seen["rows"]) == seen["rows"]
    assert 'aclserve_model_state{model="new",state="LOADING",version=""} 1.0' in seen["metrics"]
    assert 'aclserve_model_load_failure{model="new"' not in seen["metrics"]
    assert loaded == 200
    assert after["ready"] == (200, {"name": "new", "ready": True}) and after["infer"][0] == 200
    assert after["grpc ready"] is True and after["grpc infer"] == ("OK", "")


def test_a_load_call_that_fails_leaves_its_model_as_any_failed_load_does(models_dir, tmp_path, make_config):
    """LOADING while its call reads the folder; once the call has failed, what the server says of a
    model whose load failed (`broken`, whose load call ran alone), or of no model when the folder
    holds none by that name (`ghost`: 404, no row)."""
    from aclserve.server.grpc_server import GrpcServer

    async def scenario():
        config = make_config(tmp_path, settle_s=0.0)  # (explicit mode)
        repo, runner, url = await serving(config)
        grpc_server = GrpcServer(runner.app[STATE], config.max_body_bytes)
        grpc_port = await grpc_server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                (tmp_path / "broken.om").write_bytes(b"not an om file at all")  # its load fails
                assert (await answer(session, "POST", url + "/v2/repository/models/broken/load"))[0] == 400
                failed = await client_view(session, url, grpc_port, "broken")
                (tmp_path / "bad.om").write_bytes(b"not an om file at all")
                with folder_reads_held(repo) as reading:
                    loads = [asyncio.ensure_future(answer(session, "POST", f"{url}/v2/repository/models/{name}/load"))
                             for name in ("bad", "ghost")]
                    await asyncio.wait_for(reading.wait(), 30)  # a hang guard
                    await asyncio.wait_for(asyncio.gather(arrived(repo, "bad"), arrived(repo, "ghost")), 30)
                    during = {name: await client_view(session, url, grpc_port, name) for name in ("bad", "ghost")}
                statuses = [(await load)[0] for load in loads]
                after = {name: await client_view(session, url, grpc_port, name) for name in ("bad", "ghost")}
                rows = {row["name"] for row in repo.index()}
            return failed, during, statuses, after, rows
        finally:
            await grpc_server.stop()
            await runner.cleanup()

    failed, during, statuses, after, rows = asyncio.run(scenario())
    for name in ("bad", "ghost"):
        assert during[name]["ready"] == (503, {"name": name, "ready": False}), during[name]
        assert during[name]["infer"] == (503, {"error": f"model {name} is not ready (LOADING: {LOADING})"})
        assert during[name]["grpc infer"] == ("UNAVAILABLE", f"model {name} is not ready (LOADING: {LOADING})")
    assert statuses == [400, 400]  # (ghost: no such model, a failed load as Triton answers it)
    assert repr(after["bad"]) == repr(failed).replace("broken", "bad"), (after["bad"], failed)
    assert failed["ready"][0] == 404 and failed["grpc infer"][0] == "NOT_FOUND"  # (its file refused: not a retry-later)
    assert after["ghost"]["ready"] == (404, {"error": "unknown model 'ghost'"})
    assert after["ghost"]["grpc infer"] == ("NOT_FOUND", "unknown model 'ghost'")
    assert "bad" in rows and "ghost" not in rows
