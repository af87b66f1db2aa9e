"""A dropped .onnx compiles in a child process (aclserve/om/compile_process.py), so the server
answers its other models meanwhile: compiled in the server's own threads, loading the ONNX, its
shape inference and its serialisation held the GIL for seconds at a time (a request to another
model took 16.7 s beside a 1.2 GiB model's compile; an independent tester's finding). Real
server on a real port; the compile is held in its child (`compile_holds`, tests/conftest.py),
so it is known to be still running when the other model answers."""
from __future__ import annotations

import json
import os
import shutil

from tests.serving import ServerThread, request, in_thread, server_config, wait_until
from tests.tiny_models import affine_onnx

DOUBLE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
AFFINE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                     {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]}


def rows(srv) -> dict[str, tuple[str, str]]:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return {row["name"]: (row.get("state", ""), row.get("reason", "")) for row in json.loads(body)}


def test_the_other_models_are_answered_while_a_dropped_onnx_compiles(models_dir, tmp_path, compile_holds):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    with ServerThread(server_config(folder)) as srv:  # (explicit mode: double loads at start)
        wait_until(lambda: request(srv, "GET", "/v2/models/double/ready")[0] == 200, "double ready", guard_s=30)
        affine_onnx(folder / "fresh.onnx")
        load, answers = in_thread(lambda: request(srv, "POST", "/v2/repository/models/fresh/load")[0])
        wait_until(lambda: any(compile_holds.iterdir()), "the compile's process holding", guard_s=30)
        (mark,) = compile_holds.iterdir()
        pid = int(mark.name)
        assert pid != os.getpid()
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [fd for fd in fds if fd.startswith("socket:")], fds  # none of the server's sockets

        status, _, body = request(srv, "POST", "/v2/models/double/infer", json=DOUBLE)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [2.0] * 16
        assert rows(srv)["fresh"] == ("LOADING", "compiling fresh.onnx for cpu")
        assert mark.exists() and os.path.exists(f"/proc/{pid}")  # (the compile still held: it ran beside)

        mark.unlink()
        load.join(120)
        assert answers == [200]
        status, _, body = request(srv, "POST", "/v2/models/fresh/infer", json=AFFINE)
        assert status == 200, body
