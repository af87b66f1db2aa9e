"""Shutdown and client-disconnect behaviour of the real app on the test's own loop (and, for
the drain's warning, of `serve` in a server thread).

A partial batch (3 rows; gears 1,2,4,8) waits max_queue_delay_ms in the queue, which keeps a
request in flight without any test double. Nothing here asserts a duration: the tests wait
for states (in-flight count, request outcomes)."""
import asyncio
import json
import shutil
import socket
import time

import aiohttp
import numpy as np
import pytest

from tests.serving import ServerThread, started_app

from .hostile import metric

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
    while state.infer_requests.count == 0:
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
            while state.infer_requests.count:
                await asyncio.sleep(0.005)
            level = served.batcher.config.default_level
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


def test_a_runtime_that_cannot_start_lets_both_bound_ports_go(tmp_path):
    """The runtime starts once both ports are bound (a bind failure is then the start's one line,
    without the runtime's before it). One that cannot start then (npu asked: no machine here has
    CANN, nor may a process that ran the CPU runtime switch) leaves neither port bound: grpc lets a
    port it bound go only once its server has started and stopped, so one bound and never served
    stayed taken, listening, for the process's life."""
    from aclserve.acl import AclUnavailable
    from tests.serving import free_port, server_config

    grpc_port = free_port()
    server = ServerThread(server_config(tmp_path, device="npu", grpc_port=grpc_port))
    with pytest.raises(RuntimeError):
        server.start()
    server.close()
    assert isinstance(server.error, AclUnavailable), server.error
    with socket.socket() as again:  # (no SO_REUSEADDR: a socket still bound there refuses it)
        again.bind(("127.0.0.1", grpc_port))


def test_a_drain_that_times_out_says_so_once(models_dir, make_config, caplog):
    """A request still in flight when the drain ends (its body stalls: it waits on no model, so
    the models' close does not answer it) is reported once, although `serve` and the app's
    lifecycle both ask for the drain."""
    server = ServerThread(make_config(models_dir, shutdown_timeout_s=0.5)).start()
    host, port = server.url.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=30) as stalled:
            stalled.sendall(b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 1000\r\n\r\n{")
            while not metric(server.url, "aclserve_request_memory_bytes"):  # its body is being read
                time.sleep(0.02)
            server.close()
        assert not server._thread.is_alive()
    finally:
        server.close()
    warned = [m for m in caplog.messages if "still in flight" in m]
    assert len(warned) == 1, warned


def test_a_later_drain_after_one_that_timed_out_does_not_warn_again(models_dir, make_config, caplog):
    """ServerState.begin_shutdown is called by `serve` and again by the app's lifecycle: with a
    request still in flight at the second call (its deadline long past), the second used to log
    the same warning again at once."""
    async def scenario():
        runner, state, url, runtime, repo = await started_app(make_config(models_dir, shutdown_timeout_s=0.5))
        host, port = url.removeprefix("http://").rsplit(":", 1)
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
            await writer.drain()
            for _ in range(1500):  # a hang guard: until its body is being read (in flight)
                if state.infer_requests.count:
                    break
                await asyncio.sleep(0.02)
            await state.begin_shutdown()  # `serve`'s drain: times out
            await state.begin_shutdown()  # the lifecycle's, the request still in flight
            writer.close()
        finally:
            await runner.cleanup()
    asyncio.run(scenario())
    warned = [m for m in caplog.messages if "still in flight" in m]
    assert len(warned) == 1, warned


def test_metrics_are_answered_during_the_drain_and_nothing_else_on_a_new_connection(models_dir, tmp_path,
                                                                                    make_config):
    """/metrics answered 503 during the drain, as every route on a new connection, so a
    replica's last counts (the drain's successes and ShuttingDown failures, up to
    shutdown_timeout_s) were never scraped (an independent tester; Triton's metrics port stays
    up). Now GET /metrics is answered on a connection opened during the drain, and anything
    else, the health probes' included (load balancers read them), gets the 503 as before and
    the connection closes. A 3-row request waits in the queue (a window no test outlasts) and
    keeps the drain going until the test closes its connection."""
    import http.client

    from .full_queue import held_drain, status_of

    with held_drain(models_dir, tmp_path, make_config) as server:
        host, port = server.url.rsplit(":", 1)
        scrape = http.client.HTTPConnection(host, int(port), timeout=30)
        scrape.request("GET", "/metrics")
        answer = scrape.getresponse()
        text = answer.read().decode()
        assert answer.status == 200, text
        assert 'aclserve_queue_depth{model="affine",priority="2",version="1"} 1.0' in text
        scrape.request("GET", "/v2/health/live")  # on the same connection: refused, and it closes
        answer = scrape.getresponse()
        assert (answer.status, answer.getheader("Connection"), answer.read()) == (
            503, "close", b'{"error":"server is shutting down"}')
        scrape.close()
        assert [status_of(server.url, path) for path in ("/v2/health/live", "/v2/models/affine", "/metrics")] == [
            503, 503, 200]
