"""`aclserve serve` under SIGTERM while a slow client is still reading a large answer (8 MB,
binary, most of it still in the server's transport buffer): the drain waits for it as for a
request in flight, so the whole answer arrives. The drain used to close that connection at once
(nothing was in flight) and the process exited with megabytes of the answer unsent, the client
seeing EOF part-way. Both paths, the guard's direct answers and aiohttp's (log_level debug turns
the direct path off). No timed assertion: the client waits a few seconds after the signal
(the old server had exited by then) before it reads on; the rest are hang guards."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.processes import leashed_popen
from tests.serving import free_port
from tests.tiny_models import save_graph

from .hostile import read_answer_head
from .test_shutdown_deadline import wait_serving

VALUES = 2_000_000  # an 8 MB FP32 answer


def identity_onnx(path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", VALUES])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", VALUES])
    return save_graph(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ident", [x], [y]), path)


def start(tmp_path, *config: str) -> tuple[subprocess.Popen, int]:
    models = tmp_path / "models"
    models.mkdir()
    identity_onnx(models / "ident.onnx")
    port = free_port()
    # one batch size (the compile's test runs and the warm-up's of 32 rows of 8 MB took seconds), and
    # the model file, written whole before the start, taken without waiting settle_s for it
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nmodels_dir: {models}\n"
                                         "model_defaults: {compile: {batch: [1]}}\nsettle_s: 0.1\n"
                                         + "".join(line + "\n" for line in config))
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_serving(proc, port)
    return proc, port


def ask_big_answer(port: int) -> socket.socket:
    """A binary infer request whose answer (8 MB) the client has not read yet."""
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, VALUES],
                                   "parameters": {"binary_data_size": VALUES * 4}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    body = head + np.ones(VALUES, np.float32).tobytes()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer waits in the server
    sock.settimeout(60)  # a hang guard
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /v2/models/ident/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
                 b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(head), len(body)) + body)
    return sock


def read_head(sock: socket.socket) -> tuple[bytes, int]:
    """(status line, bytes of the answer after its head still to come)."""
    status, _, rest, length = read_answer_head(sock)
    return status, length - len(rest)


def read_all(sock: socket.socket) -> int:
    got = 0
    while chunk := sock.recv(65536):
        got += len(chunk)
    return got


@pytest.mark.parametrize("log_level", ["info", "debug"])  # the guard's direct answers; aiohttp's
def test_an_answer_still_being_written_at_sigterm_is_written_whole(tmp_path, log_level):
    proc, port = start(tmp_path, f"log_level: {log_level}")
    try:
        sock = ask_big_answer(port)
        status, left = read_head(sock)
        assert status == b"HTTP/1.1 200 OK", status
        proc.send_signal(signal.SIGTERM)
        for _ in range(30):  # the old server exited within about 2 s, the answer's rest unsent
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        got = read_all(sock)
        sock.close()
        out, _ = proc.communicate(timeout=120)  # a hang guard
        assert got == left, (got, left, out[-3000:])
        assert proc.returncode == 0, out
        assert "0 request(s) in flight, 1 connection(s) still sending answers" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_client_that_takes_nothing_does_not_hold_the_shutdown_past_its_deadline(tmp_path):
    proc, port = start(tmp_path, "log_level: info", "shutdown_timeout_s: 1")
    try:
        sock = ask_big_answer(port)
        status, _ = read_head(sock)  # and nothing more
        assert status == b"HTTP/1.1 200 OK", status
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # a hang guard
        sock.close()
        assert proc.returncode == 0, out
        assert "0 request(s) still in flight and 1 connection(s) still sending answers after 1.0 s" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
