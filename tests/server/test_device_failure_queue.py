"""A device that fails as a whole under load (found by a tester): the requests still waiting in
the model's queue, not yet in a batch, fail at once with the batch that found it (500, "device
0 failed as a whole"), as do those that come after, rather than wait for their queue deadline
(503) or, with none, for the drain's end (503 "shutting down", shutdown_timeout_s later), which
held up the exit for a restart. The server's last ERROR line names the device and its code, and
a SIGTERM during the drain the failure started is not said to be one "received again"."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import signal
import subprocess
import sys

from aclserve.server import app
from aclserve.server.app import EXIT_DEVICE_FAILED

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port
from tests.server import test_device_failure_exit
from tests.server.test_shutdown_deadline import wait_serving

REQUESTS = 20
WARMUP_EXECUTIONS = 12  # double.om's 4 gears x 3 runs: the 13th execution is the first request's


def infer(port: int, body: dict) -> tuple[int, dict]:
    try:
        return test_device_failure_exit.infer(port, "double", body)
    except OSError as e:  # (a connection the drain closed, or the server gone: not an answer)
        return 0, {"error": str(e)}


def test_requests_queued_behind_a_failed_device_fail_with_it(models_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(models_dir / "double.om", models / "double.om")
    # one run at a time, no queue deadline: the requests wait in the batcher's queue, not the pool's
    (models / "double.yaml").write_text("instances: 1\nbatching: {max_batch_size: 1, "
                                        "default_queue_policy: {default_timeout_ms: 0}}\n")
    port = free_port()
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nlog_level: info\n"
                                         f"models_dir: {models}\nshutdown_timeout_s: 15\n")
    env = dict(os.environ, PYTHONPATH=str(REPO),  # each run 100 ms: the requests queue up behind the fault
               ACLSERVE_CPU_FAULTS=f"execute:delay_ms=100;execute:nth={WARMUP_EXECUTIONS + 4},code=507054,device=1")
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
    try:
        wait_serving(proc, port)
        with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
            answers = list(pool.map(lambda _: infer(port, body), range(REQUESTS)))
        out, _ = proc.communicate(timeout=120)  # a hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    failed = [(status, answer["error"]) for status, answer in answers if status != 200]
    whole = "device 0 failed as a whole (507054: HBM multi-bit ECC error)"
    # from the queue at once (the batcher's, with the device's reason), or refused once the server
    # drained; none waited for the drain's end (the batcher's close: "model version ... is shutting down")
    assert any(error.startswith(f"model version double:1: {whole}") for _, error in failed), (answers, out[-3000:])
    assert all(whole in error or "server is shutting down" in error or status == 0 for status, error in failed), \
        answers
    assert proc.returncode == EXIT_DEVICE_FAILED, out[-3000:]
    last_error = [line for line in out.splitlines() if " ERROR " in line][-1]
    assert f"exiting with status 75 for a restart, which resets the device: {whole}" in last_error, out[-3000:]
    # an instance on a failed device is not rebuilt, and its lines say so
    assert "leaves rotation and is rebuilt" not in out and "rebuilding instance" not in out, out[-3000:]
    assert "double:1#0: instance is not rebuilt: device 0 failed as a whole" in out, out[-3000:]


def test_a_signal_during_the_drain_a_device_failure_started_is_said_to_be_the_first(caplog):
    """It was logged "SIGTERM received again: the drain ends now" (the serve loop's own handlers,
    on their events: the device failure's callback as the runtime calls it, from another thread)."""
    async def fail_then_signal() -> tuple[str, bool]:
        stop, hurry, stopping = asyncio.Event(), asyncio.Event(), app._Stopping()
        failed = app._on_device_failure(asyncio.get_running_loop(), stop, stopping)
        await asyncio.to_thread(failed, 0, 507054)
        await stop.wait()
        app._on_signal(signal.SIGTERM, stop, hurry, stopping)
        app._on_signal(signal.SIGTERM, stop, hurry, stopping)
        return stopping.device_failure, hurry.is_set()

    with caplog.at_level(logging.INFO, logger="aclserve.server.app"):
        assert asyncio.run(fail_then_signal()) == ("device 0 failed as a whole (507054: HBM multi-bit ECC error)", True)
    assert [r.getMessage() for r in caplog.records] == [
        "SIGTERM received during the drain that a device failure started (device 0 failed as a whole "
        "(507054: HBM multi-bit ECC error)): the drain ends now",
        "SIGTERM received again: the server is exiting"]
