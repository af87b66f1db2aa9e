"""Shutdown and client-disconnect behaviour of the real app on the test's own loop.

A partial batch (3 rows; gears 1,2,4,8) waits max_queue_delay_ms in the queue, which keeps a
request in flight without any test double. Nothing here asserts a duration: the tests wait
for states (in-flight count, request outcomes)."""
import asyncio
import json
import shutil

import aiohttp
import numpy as np
import pytest

from tests.serving import started_app

SLOW = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [1.0] * 24},
                   {"name": "idx", "datatype": "INT64", "shape": [3, 3], "data": [1] * 9}]}
FAST = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                   {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}


@pytest.fixture
def slow_config(models_dir, tmp_path, make_config):
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text("batching: {max_queue_delay_ms: 1500}\n")
    return make_config(tmp_path)


async def post(session, url, body):
    async with session.post(f"{url}/v2/models/affine/infer", json=body) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def wait_inflight(state, task):
    while state.inflight == 0:
        assert not task.done(), "the request finished before it was seen in flight"
        await asyncio.sleep(0.005)


def test_shutdown_refuses_new_requests_and_finishes_inflight(slow_config):
    async def scenario():
        runner, state, url, runtime, repo = await started_app(slow_config)
        try:
            async with aiohttp.ClientSession() as session:
                inflight = asyncio.create_task(post(session, url, SLOW))
                await wait_inflight(state, inflight)
                state.stop_accepting()
                status, headers, body = await post(session, url, FAST)
                assert status == 503 and "shutting down" in body["error"] and "Retry-After" in headers
                async with session.get(f"{url}/v2/health/ready") as resp:
                    assert resp.status == 503 and (await resp.json()) == {"ready": False}
                async with session.get(f"{url}/v2/health/live") as resp:
                    assert resp.status == 200
                await state.begin_shutdown()
                status, _, body = await inflight
                assert status == 200
                s = next(o for o in body["outputs"] if o["name"] == "s")
                assert s["data"] == [2] * 9
        finally:
            await runner.cleanup()
        # cleanup closed the repository, then the runtime
        assert not repo.all_ready() and runtime.memory() == []
    asyncio.run(scenario())


def test_client_disconnect_cancels_queued_request(slow_config):
    async def scenario():
        runner, state, url, runtime, repo = await started_app(slow_config)
        try:
            async with aiohttp.ClientSession() as session:
                task = asyncio.create_task(post(session, url, SLOW))
                await wait_inflight(state, task)
                served = repo.get("affine")
                while served.batcher.pending == 0:  # reached the queue
                    assert not task.done()
                    await asyncio.sleep(0.005)
                task.cancel()  # closes the connection
                with pytest.raises(asyncio.CancelledError):
                    await task
            while state.inflight:
                await asyncio.sleep(0.005)
            level = served.batcher.config.default_priority
            assert served.batcher.stats.levels[level].cancelled == 1
            assert served.batcher.stats.execution_count == 0  # it never ran
        finally:
            await runner.cleanup()
    asyncio.run(scenario())


def test_bad_config_exits_2_without_serving(tmp_path, capsys):
    from aclserve.cli import main
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_defaults:\n  slots: 0\n")
    assert main(["serve", "--config", str(bad), "--models", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_defaults.slots" in err[0]


def test_infer_command_prints_outputs(server, tmp_path, capsys):
    from aclserve.cli import main
    x = np.ones((2, 8), np.float32)
    idx = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "idx.npy", idx)
    code = main(["infer", "affine", "--input", f"x={tmp_path / 'x.npy'}", "--input", f"idx={tmp_path / 'idx.npy'}",
                 "--url", f"http://{server.url}", "--output", "s", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["s"]["data"] == (idx * 2).tolist()
    code = main(["infer", "affine", "--input", f"x={tmp_path / 'x.npy'}", "--url", f"http://{server.url}"])
    assert code == 1 and "missing input" in capsys.readouterr().err


def test_a_busy_port_is_reported_before_the_models_load(models_dir, tmp_path, clean_faults):
    """Bind first, then load: the port error comes although the model's warm-up can never end
    (before, the server loaded first and would have waited on it for good)."""
    import socket
    import threading

    from aclserve.acl.cpu import faults
    from tests.serving import ServerThread, server_config

    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    gate = threading.Event()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        faults.inject("execute", nth=1, hold=gate)  # the warm-up's first run never ends
        server = ServerThread(server_config(tmp_path, port=taken.getsockname()[1], model_control_mode="none"))
        try:
            with pytest.raises(RuntimeError, match="in use"):
                server.start()
        finally:
            gate.set()
            server.close()
