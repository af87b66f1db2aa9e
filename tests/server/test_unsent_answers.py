"""HTTP answers waiting on a client that does not read them: charged to the memory budget while
they wait (server/answer_charge.py). A tester's clients asking for 64 MiB answers and reading
none took the server's RSS up by 64-128 MB each while aclserve_request_memory_bytes read 0.
Real server, raw sockets with a small receive buffer (the answer waits in the server), both
HTTP paths: the guard's direct answers and aiohttp's (a request naming an Accept-Encoding goes
there)."""
from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.serving import ServerThread, server_config
from tests.tiny_models import compile_cpu_om, save_graph

from .hostile import metric, read_answer_head, wait_for

WIDE = 1 << 20  # values a row: a 4 MiB FP32 answer
ANSWER = WIDE * 4
MiB = 1 << 20
PATHS = {"direct": b"", "aiohttp": b"Accept-Encoding: identity\r\n"}
COPIES = {"direct": 1, "aiohttp": 2}  # what an unsent answer is charged: answer_charge.py


def tile_onnx(path) -> str:
    """y = Tile(x, [1, WIDE]): FP32 [N,1] -> [N,WIDE], one number in, 4 MiB out a row."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDE])
    reps = numpy_helper.from_array(np.array([1, WIDE], np.int64), "reps")
    return save_graph(helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "tile", [x], [y], [reps]),
                      path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tile")
    compile_cpu_om(tile_onnx(root / "tile.onnx"), root / "tile.om", batch="1,2")
    (root / "tile.onnx").unlink()
    return root


def serve(models, **settings) -> ServerThread:
    return ServerThread(server_config(models, model_control_mode="none", **settings))


REQUEST = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
                      "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()


def ask(url: str, path: str) -> socket.socket:
    """A client that asks for a 4 MiB answer and reads none of it yet (a 4 KB receive buffer:
    the answer waits in the server)."""
    host, port = url.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)  # a hang guard
    sock.connect((host, int(port)))
    sock.sendall(b"POST /v2/models/tile/infer HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s"
                 % (PATHS[path], len(REQUEST), REQUEST))
    return sock


def answer_head(sock: socket.socket) -> tuple[bytes, int]:
    """(status line, bytes of the answer's body still to come)."""
    status, _, rest, length = read_answer_head(sock)
    return status, length - len(rest)


def read_rest(sock: socket.socket, left: int) -> None:
    """Read the rest of an answer whose head was read."""
    while left > 0:
        chunk = sock.recv(1 << 20)
        assert chunk, left
        left -= len(chunk)


def charged(url: str) -> float:
    return metric(url, "aclserve_request_memory_bytes")


def until(check, what: str):
    """Wait for `check()` (a hang guard, not a timing check)."""
    asyncio.run(wait_for(check, limit_s=60))


@pytest.mark.parametrize("path", PATHS)
def test_answers_a_client_does_not_read_are_charged_until_it_reads_or_goes(models, path):
    # room for two unsent answers of either path, a request's 413 limit above one request's need
    with serve(models, max_body_bytes=MiB, max_request_bytes=12 * MiB, max_inflight_bytes=20 * MiB) as srv:
        readers = []
        for n in range(1, 10):  # (a hang guard: the budget refuses one long before)
            sock = ask(srv.url, path)
            status, left = answer_head(sock)
            if status != b"HTTP/1.1 200 OK":
                assert status == b"HTTP/1.1 503 Service Unavailable", status
                sock.close()
                break
            readers.append((sock, left))
            until(lambda: charged(srv.url) >= n * COPIES[path] * ANSWER, "the unsent answer charged")
        assert 2 <= len(readers) < 9, len(readers)  # the answers waiting filled the budget: 503 for others
        other = ask(srv.url, "direct")
        assert answer_head(other)[0] == b"HTTP/1.1 503 Service Unavailable"
        other.close()
        held = charged(srv.url)
        readers.pop()[0].close()  # a client that goes gives its answer's charge back
        until(lambda: charged(srv.url) <= held - COPIES[path] * ANSWER, "a closed client's charge given back")
        for sock, left in readers:  # the others read their answers whole: charged no more
            read_rest(sock, left)
        until(lambda: charged(srv.url) == 0, "every charge given back")
        ok = ask(srv.url, path)
        status, left = answer_head(ok)
        assert status == b"HTTP/1.1 200 OK"
        read_rest(ok, left)
        for sock, _ in readers + [(ok, 0)]:
            sock.close()
