"""`aclserve serve` on a device that fails as a whole (an HBM multi-bit ECC error: every context
on it fails until the process restarts, runtime/device_health.py): one ERROR line says so, the
request in flight is answered, the server drains as on SIGTERM and exits with status 75 for its
supervisor to restart it, rather than rebuild its instances on the failed device for good while
/v2/health/live said 200. A fault of one context (the default code, 507011) still rebuilds the
instance and serves on: test_stop_on_failure.py, test_batch_isolation.py. Until it exits,
/metrics counts the failed device."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from aclserve.server.app import EXIT_DEVICE_FAILED

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, json_call, wait_until
from tests.server.full_queue import DEPTH, HELD_WINDOW_MS, WAITING, request
from tests.server.hostile import metric
from tests.server.test_shutdown_deadline import wait_serving

# the warm-up runs 24 executions (2 models x 4 gears x 3 runs): the 25th is the first request's
WARMUP_EXECUTIONS = 24


def infer(port: int, model: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def serve_failing_at_the_first_request(models, tmp_path, shutdown_timeout_s: float) -> tuple[subprocess.Popen, int]:
    """`aclserve serve` of `models` (affine and double), device 0 failing as a whole at the first
    execution after the warm-up."""
    port = free_port()
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nlog_level: info\n"
                                         f"models_dir: {models}\nshutdown_timeout_s: {shutdown_timeout_s}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), ACLSERVE_CPU_DEVICES="2",
               ACLSERVE_CPU_FAULTS=f"execute:nth={WARMUP_EXECUTIONS + 1},code=507054,device=1")
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, port


def test_a_failed_device_drains_and_exits_for_a_restart(models_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("affine.om", "double.om"):
        shutil.copy(models_dir / name, models / name)
    proc, port = serve_failing_at_the_first_request(models, tmp_path, 20)
    try:
        wait_serving(proc, port)  # (both models warmed up: the fault is still to come)
        status, answer = infer(port, "double", {"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
        assert status == 500
        assert "device 0 failed as a whole (507054: HBM multi-bit ECC error)" in answer["error"]
        out, _ = proc.communicate(timeout=120)  # a hang guard: no rebuild loop keeps it up
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_DEVICE_FAILED == 75, out[-3000:]
    failed = [line for line in out.splitlines() if "failed as a whole" in line and " ERROR " in line
              and "aclserve.runtime.acl_runtime" in line]
    assert len(failed) == 1, out[-3000:]
    assert f"the server drains and exits with status {EXIT_DEVICE_FAILED}" in failed[0]
    assert "draining" in out.split(failed[0])[1]  # the SIGTERM path, after it
    for model in ("affine", "double"):
        assert f"{model}: version 1 unloaded (the server is shutting down)" in out
    assert "rebuilt; serving again" not in out and "trying again in" not in out, out[-3000:]


STOPPING = ("server is stopping: device 0 failed as a whole (507054: HBM multi-bit ECC error); it exits with "
            f"status {EXIT_DEVICE_FAILED} to be restarted")


def unasked_answer(conn: socket.socket) -> tuple[int, dict]:
    """(status, JSON body) of what the server writes on `conn`, which sent nothing, until it closes it."""
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_the_failed_device_is_counted_on_metrics_and_named_by_the_drain_until_the_exit(models_dir, tmp_path):
    """aclserve_devices_failed, read once the failure is answered, before the exit: affine, on
    device 1, holds a partial batch in its queue (a window no test outlasts), which keeps the
    drain the failure begins going until the test closes its connection; double, on device 0,
    fails the device. A request the drain refuses is told why the server stops (it said "server is
    shutting down", as on SIGTERM) and that it comes back: an infer, a probe on a connection opened
    during the drain (tracking.py), and a connection idle as the drain began, sent the 503 unasked as its
    grace ends (connections.py: these two said "server is shutting down" still)."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("affine.om", "double.om"):
        shutil.copy(models_dir / name, models / name)
    (models / "affine.yaml").write_text(f"devices: [1]\nbatching: {{max_queue_delay_ms: {HELD_WINDOW_MS}}}\n")
    proc, port = serve_failing_at_the_first_request(models, tmp_path, 120)
    url = f"127.0.0.1:{port}"
    try:
        wait_serving(proc, port)
        assert metric(url, "aclserve_devices_failed") == 0
        with socket.create_connection(("127.0.0.1", port), timeout=60) as waiting, \
                socket.create_connection(("127.0.0.1", port), timeout=60) as idle:
            waiting.sendall(request(WAITING))
            while metric(url, "aclserve_queue_depth", DEPTH) != 1:
                time.sleep(0.02)
            status, answer = infer(port, "double", {"inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
            assert status == 500 and "device 0 failed as a whole" in answer["error"], answer
            assert metric(url, "aclserve_devices_failed") == 1
            wait_until(lambda: json_call(url, "/v2/health/ready")[0] != 200, "the drain begun")
            status, answer = infer(port, "affine", {"inputs": [  # refused for the drain, saying why it stops
                {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]})
            assert status == 503 and answer["error"] == STOPPING, answer
            assert json_call(url, "/v2/health/live") == (503, {"error": STOPPING})  # a new connection's probe
            assert unasked_answer(idle) == (503, {"error": STOPPING})  # (once its grace is over)
        out, _ = proc.communicate(timeout=120)  # its request cancelled, the drain ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_DEVICE_FAILED, out[-3000:]
