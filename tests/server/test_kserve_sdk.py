"""The KServe SDK's own clients (InferenceRESTClient with protocol v2, InferenceGRPCClient) on a
real server: README says they work unchanged, and only a KServe user's manual check said so.
They run in a child process (tests/kserve_clients.py: the SDK's protobuf messages clash with
tritonclient's, which the server holds)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests import REPO
from tests.serving import ServerThread, free_port, server_config

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


def test_the_rest_client_speaking_v2_and_the_grpc_client(models_dir, reference):
    with ServerThread(server_config(models_dir, grpc_port=free_port())) as srv:
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "kserve_clients.py"), f"http://{srv.url}",
                               f"127.0.0.1:{srv.config.grpc_port}"], capture_output=True, text=True, timeout=300,
                              cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["live"] is True and got["ready"] is True
    want = reference(X, IDX)
    for way in ("rest_binary", "rest_json", "grpc"):
        assert got[way]["id"] == "kserve-1", way
        np.testing.assert_allclose(got[way]["outputs"]["y"], want["y"], rtol=1e-5, err_msg=way)
        np.testing.assert_array_equal(got[way]["outputs"]["s"], want["s"], err_msg=way)
