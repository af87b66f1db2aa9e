"""A server whose device_limits.events is above the events its device has: the ledger lets the
model through, and the device does not refuse its events as they are made (CANN takes them at
record_event) but makes a record past them wait for a release. So the server meets what a device
does, not a clean 207007 at the load: with plain create_event events (an older CANN without
create_event_ex_with_flag; each holds its resource until destroyed) the warm-up's run ends at
the execution timeout; with the slots' create_event_ex_with_flag(SYNC) events, which hold one
only while a record of theirs is waited for, it serves on a single one. The start says in a
WARNING that the setting is above the device's events. A process of its own each: the CPU runtime
reads ACLSERVE_CPU_MAX_EVENTS when ACL starts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, json_call

ABOVE = "device_limits.events is 1000, above the {} events the CPU runtime has (ACLSERVE_CPU_MAX_EVENTS, by default its SoC's)"


def _serve(tmp_path, model_config: str, **env: str) -> tuple[subprocess.Popen, str]:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(REPO / "models" / "digits.om", models / "digits.om")
    (models / "digits.yaml").write_text(model_config)
    (tmp_path / "server.yaml").write_text("device_limits: {events: 1000}\n")
    port = free_port()
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "server.yaml"),
                            "--models", str(models), "--port", str(port), "--grpc-port", "0", "--device", "cpu",
                            "--log-level", "warning"],
                           cwd=REPO, env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    return server, f"127.0.0.1:{port}"


def _digits_row(url: str) -> dict:
    """The model's index row once it is served or its load failed."""
    for _ in range(6000):  # a hang guard
        status, rows = json_call(url, "/v2/repository/index", b"{}")
        row = next((r for r in rows or () if r["name"] == "digits"), None)
        if status == 200 and row is not None and (row["state"] == "READY" or "failed" in row["reason"]):
            return row
        time.sleep(0.01)
    raise AssertionError(f"the model never settled: {rows}")


def _stop(server: subprocess.Popen) -> str:
    server.terminate()
    return server.communicate(timeout=60)[1]


def test_plain_events_past_the_device_end_the_warm_up_at_the_execution_timeout(tmp_path):
    """Three events, and a lone batch's four on its one slot: its fourth record waits for good."""
    server, url = _serve(tmp_path, "execution_timeout_ms: 300\nreset_timeout_ms: 100\nslots: 1\n",
                         ACLSERVE_CPU_MAX_EVENTS="3", ACLSERVE_CPU_LACKS="rt.create_event_ex_with_flag")
    try:
        row = _digits_row(url)
    finally:
        stderr = _stop(server)
    assert "the device did not finish the batch within the model's execution timeout (300 ms)" in row["reason"]
    assert "207007" not in row["reason"]
    assert ABOVE.format(3) in stderr


def test_the_slots_events_serve_on_a_single_one(tmp_path):
    server, url = _serve(tmp_path, "slots: 2\n", ACLSERVE_CPU_MAX_EVENTS="1")
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}).encode()
    try:
        assert _digits_row(url)["state"] == "READY"
        with ThreadPoolExecutor(8) as pool:  # batches in flight together: their records wait for one another
            answers = list(pool.map(lambda _: json_call(url, "/v2/models/digits/infer", body), range(32)))
        assert [status for status, _ in answers] == [200] * 32, answers[:2]
    finally:
        stderr = _stop(server)
    assert ABOVE.format(1) in stderr
