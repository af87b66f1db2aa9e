"""Shutdown while the device hangs on a batch: the server stops within the reach of
`shutdown_timeout_s`, not when the device lets go; the request still waiting gets a 503, not a
closed connection; the hung instance is abandoned (memory left allocated) and ACL is not
finalized under it. Also an unload over HTTP in the same state. The execution is held by a
CPU-runtime fault until the test ends; the only time limits are hang guards."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import aiohttp
import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import ShuttingDown
from aclserve.runtime import teardown

from tests.hung_device import HeldRows, let_go
from tests.processes import leashed_popen
from tests.serving import ServerThread, free_port, request, started_app
from tests.tiny_models import affine_request

from .hostile import metric

ONE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                  {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}


@pytest.fixture
def hung_model(models_dir, tmp_path):
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    # only the shutdown can end the wait: the execution timeout is far away
    (tmp_path / "affine.yaml").write_text("execution_timeout_ms: 600000\n")
    return tmp_path


def test_shutdown_while_a_batch_hangs_answers_503_and_does_not_wait_for_the_device(
        hung_model, make_config, clean_faults, caplog):
    gate = threading.Event()
    answer: dict = {}
    server = ServerThread(make_config(hung_model, model_control_mode="none", shutdown_timeout_s=0.5)).start()
    client = threading.Thread(target=lambda: answer.update(
        r=request(server, "POST", "/v2/models/affine/infer", json=ONE)))
    try:
        held = faults.inject("execute", nth=1, hold=gate)
        client.start()
        assert held.entered.wait(30)
        server.close()  # joins the server's thread for at most 60 s (a hang guard)
        assert not server._thread.is_alive() and not gate.is_set()
        client.join(30)
        status, headers, body = answer["r"]
        assert status == 503 and "Retry-After" in headers, body
        assert teardown.held() == 1
        assert "abandoned" in caplog.text and "not finalized" in caplog.text
    finally:
        let_go(gate)
        server.close()
        if client.is_alive():
            client.join(30)


@contextlib.contextmanager
def _serving_a_hung_batch(hung_model, tmp_path, **env):
    """`aclserve serve` (its output in the log file yielded) whose device sleeps ten minutes in
    every execution after the warm-up's, with one request's batch on the device: yields the
    process, the log file and the request's answer (a dict, "r" once it came). The process is
    killed at the end if it still runs."""
    port = free_port()
    server = types.SimpleNamespace(url=f"127.0.0.1:{port}")
    warm_up = 4 * 3  # three runs of each of the four gears (1, 2, 4, 8)
    env = dict(os.environ, ACLSERVE_CPU_FAULTS=f"execute:delay_ms=600000,nth={warm_up + 1},count=1000", **env)
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nshutdown_timeout_s: 0.5\n"
                                         f"log_level: info\nmodels_dir: {hung_model}\n")
    log_file = tmp_path / "serve.log"
    with open(log_file, "w") as out:
        proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                             env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    answer: dict = {}
    client = threading.Thread(target=lambda: answer.update(
        r=request(server, "POST", "/v2/models/affine/infer", json=ONE)))
    try:
        for _ in range(1200):  # a hang guard: until it serves (it may settle its file first)
            try:
                if request(server, "GET", "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)  # a 503 "not ready" came back at once: 1,200 of them ran out in a second
        else:
            pytest.fail("the server never became ready")
        busy = 'model="affine",version="1"'
        client.start()
        while not metric(server.url, "aclserve_instance_busy_ratio", busy):  # the batch is on the device
            time.sleep(0.02)
        yield proc, server, log_file, answer
        client.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if client.is_alive():
            client.join(30)


def test_sigterm_while_a_batch_hangs_ends_the_process(hung_model, tmp_path):
    """`aclserve serve` under SIGTERM with a device that sleeps ten minutes in every execution
    after the warm-up's: the process exits (0) with the execution still running, and the
    request gets its 503."""
    with _serving_a_hung_batch(hung_model, tmp_path) as (proc, _, log_file, answer):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # a hang guard: it waited for the device before
    out = log_file.read_text()
    assert proc.returncode == 0, out
    assert answer["r"][0] == 503, answer
    assert "abandoned" in out and "not finalized" in out, out


def test_an_unload_while_a_batch_hangs_is_answered_and_metrics_show_the_abandoned_instance(
        hung_model, make_config, clean_faults):
    async def scenario(gate: threading.Event):
        runner, state, url, runtime, repo = await started_app(make_config(hung_model, shutdown_timeout_s=0.5))
        try:
            for instance in repo.get("affine").pool.instances:
                instance.reset_timeout_ms = 200  # how long the close waits for the device
            held = faults.inject("execute", nth=1, hold=gate)
            async with aiohttp.ClientSession() as session:
                hung = asyncio.ensure_future(session.post(f"{url}/v2/models/affine/infer", json=ONE))
                await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, held.entered.wait), 30)
                async with session.post(f"{url}/v2/repository/models/affine/unload") as resp:
                    assert resp.status == 200
                async with await asyncio.wait_for(hung, 30) as resp:
                    assert resp.status == 503
                async with session.get(f"{url}/metrics") as resp:
                    assert "aclserve_abandoned_instances 1.0" in await resp.text()
        finally:
            await runner.cleanup()
    gate = threading.Event()
    try:
        asyncio.run(scenario(gate))
    finally:
        let_go(gate)


def test_shutdown_while_a_launch_hangs_answers_its_requests_by_the_deadline(hung_model, make_config, caplog):
    """The instance's launcher thread stuck inside a launch (its pack held here, as a hung
    memcpy_async or execute_async call would hold it), a second request queued behind it:
    shutdown answers both (ShuttingDown, a 503) by its own deadline although the instance would
    wait ten minutes for itself, abandons the instance, and leaves the device and ACL alone
    under the launcher."""
    (hung_model / "affine.yaml").write_text("execution_timeout_ms: 600000\nslots: 2\n")

    async def scenario(gate: threading.Event):
        runner, state, url, runtime, repo = await started_app(make_config(hung_model, shutdown_timeout_s=0.5))
        try:
            served = repo.get("affine")
            for instance in served.pool.instances:
                instance.reset_timeout_ms = 600_000  # only the shutdown's deadline can end the close
            held = affine_request(1)
            held["x"] = HeldRows(held["x"], gate)
            first = asyncio.ensure_future(served.infer(held, 1))
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, held["x"].entered.wait), 30)
            second = asyncio.ensure_future(served.infer(affine_request(1, 1), 1))
            await asyncio.sleep(0)
        finally:
            await asyncio.wait_for(runner.cleanup(), 30)  # a hang guard: ten minutes otherwise
        for answer in (first, second):
            with pytest.raises(ShuttingDown):
                await asyncio.wait_for(answer, 30)
        assert teardown.held() == 1 and not gate.is_set()
        assert "abandoned" in caplog.text and "not finalized" in caplog.text
    gate = threading.Event()
    try:
        asyncio.run(scenario(gate))
    finally:
        let_go(gate)


def test_sigterm_while_a_retry_of_an_abandoned_instance_waits_on_the_device_does_not_wait_for_it(
        hung_model, tmp_path):
    """Where CANN cannot time a stream's wait (ACLSERVE_CPU_LACKS), an instance an unload
    abandoned while its batch hung is retried, once its threads ended, with an untimed wait on
    its stream, which the device never answers here. The runtime's close waits for that retry
    (2 s), or runs the wait itself (for as long as the device hangs), and did so on the event
    loop: the exit took 2.07 s after SIGTERM with nothing in flight (shutdown_timeout_s 0.5),
    or the device's hang. Now the close runs in a thread, left to it at the shutdown's end,
    which says so; the process exits (0) without it."""
    # the unload abandons the instance (its drain, 0.5 s, then its close's 0.3 s) while the
    # instance's completer still waits for the batch; that wait ends at the execution timeout
    (hung_model / "affine.yaml").write_text("execution_timeout_ms: 3000\nreset_timeout_ms: 300\n")
    with _serving_a_hung_batch(hung_model, tmp_path, ACLSERVE_CPU_LACKS="rt.synchronize_stream_with_timeout") as (
            proc, server, log_file, answer):
        assert request(server, "POST", "/v2/repository/models/affine/unload")[0] == 200
        for _ in range(3000):  # a hang guard: until the instance's threads have ended (its completer's timeout)
            if "did not finish a batch within 3000 ms" in log_file.read_text():
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # a hang guard: the device's hang is ten minutes
    out = log_file.read_text()
    assert proc.returncode == 0, out
    assert answer["r"][0] == 503, answer
    assert "affine:1#0: its thread affine:1#0-complete is still running past the close's deadline" in out, out
    assert ("shutdown: the runtime's close (devices reset, ACL finalized) did not end by the shutdown's "
            "deadline; it is left to its thread") in out, out
    assert "runtime closed" not in out, out
