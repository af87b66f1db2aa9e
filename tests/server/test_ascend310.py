"""A server on an Ascend310 (Atlas 200/300/500), which takes no timeout for its event waits
(CANN: -1, forever, only): the CPU runtime presenting that SoC refuses a timed event wait as
the device does, so the server must wait for events untimed there, or fail every batch. A
process of its own: the CPU runtime reads its SoC when ACL starts."""
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


def test_a_server_on_an_ascend310_answers_with_untimed_event_waits(tmp_path):
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "digits.om")
    port = free_port()
    env = dict(os.environ, ACLSERVE_CPU_SOC="Ascend310")
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path), "--port",
                            str(port), "--grpc-port", "0", "--device", "cpu", "--log-level", "warning"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"127.0.0.1:{port}"
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})
    try:
        for _ in range(6000):  # a hang guard
            if json_call(url, "/v2/health/ready")[0] == 200:
                break
            time.sleep(0.01)
        with ThreadPoolExecutor(16) as pool:  # many at once: batches in flight together
            answers = list(pool.map(lambda _: json_call(url, "/v2/models/digits/infer", body.encode()), range(64)))
        assert [status for status, _ in answers] == [200] * 64, answers
        assert len({json.dumps(doc["outputs"]) for _, doc in answers}) == 1
        assert len(answers[0][1]["outputs"][0]["data"]) == 10
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert "the Ascend310 cannot time an event wait" in stderr
