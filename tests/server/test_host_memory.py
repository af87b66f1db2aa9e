"""A request the server runs out of memory for (a MemoryError while it is served) is answered as
the memory budget's refusals are: 503 with Retry-After over HTTP, UNAVAILABLE over gRPC, a
message saying so, one WARNING line naming where memory ran out, no traceback, counted under its
own reason. It was `HTTP 500: internal error` with a traceback in the log (tester t87: an
address-space limit near the server's size, a 27 MB PNG to an image model).

A real `aclserve serve` process whose address space (RLIMIT_AS) is limited, once it serves, to
what it holds then and 64 MiB more (resource.prlimit on its pid: this process's own limits are
not touched); eight pictures of one pixel for a model taking 12 MiB a picture (FP32 [N, 3, 1024,
1024]) need 96 MiB for their input tensor, which the server cannot have then, while one picture
fits. Asked through each path a request takes: the connection guard's direct answer (a small body
with its head), aiohttp's (the same with Accept-Encoding) and gRPC's."""
from __future__ import annotations

import base64
import http.client
import json
import os
import resource
import socket
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests import REPO
from tests.images.images_data import encode
from tests.processes import leashed_popen
from tests.serving import free_port, json_call, listened_by, wait_until
from tests.tiny_models import compile_cpu_om, save_graph

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")

SIDE = 1024  # a picture is an FP32 row of 3 x 1024 x 1024: 12 MiB
ROOM = 64 << 20  # the address space the server may take beyond what it holds once it serves
PIXEL = encode(np.array([[[200, 10, 10]]], np.uint8))
SAID = ("the server ran out of memory serving this request (its host's, or its address-space limit): try again "
        "later, or send a smaller request")


def _models(root):
    models, src = root / "models", root / "src"
    models.mkdir()
    src.mkdir()
    vi = helper.make_tensor_value_info
    means = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph([means], "means", [vi("x", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
                              [vi("y", TensorProto.FLOAT, ["N", 3])])
    compile_cpu_om(save_graph(graph, src / "means.onnx"), models / "means.om", batch="1,2,4,8")
    (models / "means.yaml").write_text("inputs:\n  x:\n    image: {mean: [120], std: [60]}\n")
    os.utime(models / "means.om", (1, 1))  # (old: served at once, without the settle wait)
    return models


def _body(pictures: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [pictures],
                                   "data": [base64.b64encode(PIXEL).decode()] * pictures}]}).encode()


def _post(port: int, pictures: int, via_aiohttp: bool = False) -> tuple[int, dict, dict]:
    """(status, headers, JSON answer) of an infer request of `pictures` pictures, its head and body
    sent at once (the guard answers a plain request whose body came with its head); `via_aiohttp`:
    with Accept-Encoding, which the guard leaves to aiohttp (it may compress the answer)."""
    body = _body(pictures)
    head = ["POST /v2/models/means/infer HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += ["Accept-Encoding: identity"] if via_aiohttp else []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, dict(answer.getheaders()), json.loads(answer.read())


def _grpc(port: int, pictures: int):
    """What a gRPC ModelInfer of `pictures` pictures ends with: its output, or the error raised."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        x = grpcclient.InferInput("x", [pictures], "BYTES")
        x.set_data_from_numpy(np.array([PIXEL] * pictures, dtype=object))
        try:
            return client.infer("means", [x], client_timeout=60).as_numpy("y")
        except InferenceServerException as e:
            return e


def _metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _limit_address_space(pid: int, room: int) -> None:
    with open(f"/proc/{pid}/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.prlimit(pid, resource.RLIMIT_AS, (size + room, resource.RLIM_INFINITY))


def test_a_request_the_server_runs_out_of_memory_for_is_503_unavailable_in_one_warning_line(tmp_path):
    models = _models(tmp_path)
    port, grpc_port = free_port(), free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port",
                                str(port), "--grpc-port", str(grpc_port), "--device", "cpu"],
                               cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
                               stderr=stderr)
    try:
        wait_until(lambda: json_call(f"127.0.0.1:{port}", "/v2/health/ready")[0] == 200 or server.poll() is not None,
                   "ready")
        assert server.poll() is None and listened_by(server.pid, port)
        # before the limit, eight pictures are served (and the decode threads they take are started)
        assert _post(port, 8)[0] == 200
        assert isinstance(_grpc(grpc_port, 8), np.ndarray)
        direct = _metric(port, "aclserve_direct_infer_total")
        _limit_address_space(server.pid, ROOM)

        for via_aiohttp in (False, True):  # the guard's direct answer, then aiohttp's
            status, headers, answer = _post(port, 8, via_aiohttp)
            assert (status, headers.get("Retry-After"), answer) == (503, "1", {"error": SAID}), (status, answer)
            assert _metric(port, "aclserve_direct_infer_total") == direct + 1  # (the first one only)
        refused = _grpc(grpc_port, 8)
        assert not isinstance(refused, np.ndarray)
        assert (refused.status(), refused.message()) == ("StatusCode.UNAVAILABLE", SAID)
        # one picture fits: the server serves on under the limit
        status, _, answer = _post(port, 1)
        assert status == 200, answer
        assert isinstance(_grpc(grpc_port, 1), np.ndarray)
        assert _metric(port, 'aclserve_request_failure_total{model="means",reason="HostOutOfMemory"') == 3
        assert _metric(port, 'aclserve_request_failure_total{model="means",reason="InternalError"') == 0
    finally:
        server.terminate()
        server.wait(60)
    lines = log.read_text().splitlines()
    said = [line for line in lines if "host short of memory" in line]
    assert len(said) == 3 and all(" WARNING aclserve.server.host_memory: host short of memory: a request to model "
                                  "means was refused 503 / UNAVAILABLE (MemoryError at images/stage.py:" in line
                                  for line in said), said
    assert not any("Traceback" in line or "internal error" in line for line in lines), lines
