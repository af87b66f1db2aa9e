"""A server on an Ascend310 (Atlas 200/300/500), which takes no timeout for its waits (CANN:
-1, forever, only) and has no create_event_ex_with_flag: the CPU runtime presenting that SoC
refuses a timed wait as the device does, and a plain event recorded again after a stream
waited on it, so the server must wait untimed there and keep each batch on one stream, or
fail its batches. A process of its own: the CPU runtime reads its SoC when ACL starts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tests import REPO
from tests.serving import free_port


def _call(url: str, path: str, body: bytes | None = None):
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def test_a_server_on_an_ascend310_answers_with_untimed_waits(tmp_path):
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "digits.om")
    port = free_port()
    env = dict(os.environ, ACLSERVE_CPU_SOC="Ascend310")
    server = subprocess.Popen([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path), "--port",
                               str(port), "--grpc-port", "0", "--device", "cpu", "--log-level", "warning"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"127.0.0.1:{port}"
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})
    try:
        for _ in range(6000):  # a hang guard
            if _call(url, "/v2/health/ready")[0] == 200:
                break
            time.sleep(0.01)
        # many at once: batches in flight together, each on one stream (no events another
        # stream could wait on batch after batch there: see compat.pipeline_event)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: _call(url, "/v2/models/digits/infer", body.encode()), range(64)))
        assert [status for status, _ in answers] == [200] * 64, answers
        assert len({json.dumps(doc["outputs"]) for _, doc in answers}) == 1
        assert len(answers[0][1]["outputs"][0]["data"]) == 10
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert "the Ascend310 cannot time a wait" in stderr
    assert stderr.count("each batch runs its copies and execution on one stream") == 1
