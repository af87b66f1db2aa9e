"""ACLSERVE_CPU_THREADS is the Python API's default (Engine's cpu_threads when not given);
`aclserve serve` runs its own cpu_threads setting, so the variable does not stop it. A real
`aclserve serve` process."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port


def test_serve_starts_and_serves_with_an_acl_cpu_threads_it_ignores_saying_so(tmp_path):
    """It stopped with "error: ACLSERVE_CPU_THREADS must be an integer from 1 to 1024, got 'abc'"
    though README's environment table says serve uses cpu_threads instead."""
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models")
    port = free_port()
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", "models", "--port", str(port),
                          "--grpc-port", "0", "--device", "cpu", "--model-control-mode", "none",
                          "--log-format", "json"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "ACLSERVE_CPU_THREADS": "abc"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1]
        x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][:1]
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                       "data": x.ravel().tolist()}]}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v2/models/digits/infer", data=body),
                                    timeout=60) as answer:
            assert json.load(answer)["outputs"][0]["shape"] == [1, 10]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stderr
    warnings = [json.loads(line)["message"] for line in stderr.splitlines() if '"warning"' in line]
    assert ("ACLSERVE_CPU_THREADS='abc' is ignored: aclserve serve runs 1 ONNX Runtime thread(s) per model on the "
            "CPU runtime, its cpu_threads setting (--cpu-threads)") in warnings, stderr
