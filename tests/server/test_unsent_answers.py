"""HTTP answers waiting on a client that does not read them: charged to the memory budget while
they wait (server/answer_charge.py), and a client that takes them too slowly closed by the send
deadline (server/send_deadline.py). A tester's clients asking for 64 MiB answers and reading
none took the server's RSS up by 64-128 MB each while aclserve_request_memory_bytes read 0, and
one reading 2 KB every 30 s kept its answer for good. Real server, raw sockets with a small
receive buffer (the answer waits in the server), both HTTP paths: the guard's direct answers
and aiohttp's (a request naming an Accept-Encoding goes there)."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.server.send_deadline import SendClock

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


def infer_request(rows: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 1], "data": [1.0] * rows}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()


def ask(url: str, path: str, rows: int = 1) -> socket.socket:
    """A client that asks for a 4 MiB answer a row and reads none of it yet (a 4 KB receive
    buffer: the answer waits in the server)."""
    host, port = url.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)  # a hang guard
    sock.connect((host, int(port)))
    body = infer_request(rows)
    sock.sendall(b"POST /v2/models/tile/infer HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s"
                 % (PATHS[path], len(body), body))
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


def serve_on_uvloop(models, request_mib: int = 12, inflight_mib: int = 20) -> ServerThread:
    """A send deadline of 1 MiB/s after a grace of 1 s (body_timeout_s), idle connections closed
    after 0.5 s."""
    uvloop = pytest.importorskip("uvloop")  # (as `aclserve serve` runs)
    config = server_config(models, model_control_mode="none", max_body_bytes=MiB, max_request_bytes=request_mib * MiB,
                           max_inflight_bytes=inflight_mib * MiB, body_timeout_s=1, keepalive_timeout_s=0.5,
                           send_min_bytes_per_s=MiB)
    return ServerThread(config, run=uvloop.run)


def closed(url: str, reason: str) -> float:
    return metric(url, "aclserve_connections_closed_total", f'reason="{reason}"')


@pytest.mark.parametrize("path", PATHS)
def test_a_client_taking_its_answer_too_slowly_is_closed(models, path):
    """2 KB every 0.2 s (10 KB/s) against a floor of 1 MiB/s after a grace of 1 s: cut, and the
    charge given back. Before, any progress counted and the connection stayed open."""
    with serve_on_uvloop(models) as srv:
        sock = ask(srv.url, path)
        assert answer_head(sock)[0] == b"HTTP/1.1 200 OK"
        until(lambda: charged(srv.url) > 0, "the unsent answer charged")
        taken, cut = 0, False
        for _ in range(300):  # (a hang guard: a minute)
            time.sleep(0.2)
            try:
                chunk = sock.recv(2048)
            except ConnectionError:  # reset: what it had not taken was dropped
                cut = True
                break
            if not chunk:
                cut = True
                break
            taken += len(chunk)
        sock.close()
        assert cut and taken < ANSWER // 2, taken
        assert closed(srv.url, "slow_reader") == 1
        until(lambda: charged(srv.url) == 0, "its charge given back")


@pytest.mark.parametrize("path", PATHS)
def test_a_client_that_stops_taking_its_answer_is_closed_by_the_send_deadline(models, path):
    """A client that takes 1 MiB of an 8 MiB answer at once, then nothing: the send deadline
    allows for what it took (at 1 MiB/s, a second past the grace) and then cuts it, counted as
    slow_reader. Before, the idle connections' no-progress rule, timed from the answer's end and
    blind to what was taken before it first looked, cut it first, as idle_timeout; on aiohttp's
    path, which writes the answer after its request ends (when the send clock starts), it did so
    now and then even to a client that took nothing (the test above, a flake)."""
    # (an 8 MiB answer: twice that charged on aiohttp's path)
    with serve_on_uvloop(models, request_mib=40, inflight_mib=80) as srv, ask(srv.url, path, rows=2) as sock:
        status, left = answer_head(sock)
        assert status == b"HTTP/1.1 200 OK"
        taken = 0
        while taken < MiB:
            chunk = sock.recv(MiB - taken)
            assert chunk, taken
            taken += len(chunk)
        until(lambda: closed(srv.url, "slow_reader") + closed(srv.url, "idle_timeout"), "the connection closed")
        assert (closed(srv.url, "slow_reader"), closed(srv.url, "idle_timeout")) == (1, 0)
        try:  # cut: what it had not taken was dropped
            while chunk := sock.recv(MiB):
                taken += len(chunk)
        except ConnectionError:
            pass
        assert taken < left, taken
        until(lambda: charged(srv.url) == 0, "its charge given back")


def test_the_send_clock_asks_a_rate_after_the_grace():
    grace, rate = 10.0, 1000.0
    idle = SendClock(0.0, 50_000)
    assert not idle.overdue(10.0, 50_000, grace, rate)  # within the grace: nothing asked
    assert idle.overdue(10.5, 50_000, grace, rate)  # nothing taken once it has passed
    keeping_up = SendClock(0.0, 100_000)
    for second in range(1, 60):  # 1,500 bytes a second, above the floor
        assert not keeping_up.overdue(float(second), 100_000 - 1_500 * second, grace, rate)
    trickle = SendClock(0.0, 100_000)
    overdue = [trickle.overdue(float(second), 100_000 - 500 * second, grace, rate) for second in range(1, 30)]
    assert overdue.index(True) == 20  # at 21 s: taken 10,500 of the 11,000 due (at 20 s, 10,000 of 10,000)
    grown = SendClock(0.0, 10_000)
    assert not grown.overdue(5.0, 90_000, grace, rate)  # bytes added (an answer written): not taken
    assert grown.overdue(11.0, 90_000, grace, rate) and grown.taken == 0
