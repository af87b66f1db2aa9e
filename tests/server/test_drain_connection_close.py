"""Answers written during the drain say `Connection: close` (RFC 9112 9.6), and the connection
closes after them: a pooled client (aiohttp, tritonclient's aio) then sends its next request on a
new connection, to another replica. They used to keep it alive, the server closing it ~0.1 s
later, and a client that had sent its next request on it meanwhile saw ServerDisconnectedError.
Both paths: the guard's direct answers and aiohttp's (direct_infer off). A real server in a
thread; the batch is held in its execute (a CPU fault's hold) until the drain has begun."""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from aclserve.acl.cpu import faults
from tests.serving import ServerThread, server_config

from .hostile import read_answer_head

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                              {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]}).encode()


def ask(url: str) -> socket.socket:
    """A keep-alive infer request, its answer not read yet."""
    host, port = url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)  # a hang guard
    sock.sendall(b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    return sock


def answer(sock: socket.socket) -> tuple[bytes, list[bytes], bytes]:
    """(status line, header lines lowercased, what the server sent after the answer until it closed)."""
    status, headers, rest, length = read_answer_head(sock)
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    after = rest[length:]
    while chunk := sock.recv(65536):  # until the server closes (the timeout: a hang guard)
        after += chunk
    return status, headers, after


def draining(url: str) -> bool:
    """Whether the drain has begun: a connection opened then is answered 503 (but /metrics)."""
    try:
        return urllib.request.urlopen(f"http://{url}/v2/health/live", timeout=10).status != 200
    except urllib.error.HTTPError as e:
        e.close()
        return e.code == 503


def wait_until(predicate) -> None:
    for _ in range(1200):  # a hang guard
        if predicate():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"{predicate} never came true")


def drain_begun(srv: ServerThread) -> None:
    srv.begin_close()
    wait_until(lambda: draining(srv.url))


def closed_after(sock: socket.socket, status_wanted: bytes) -> None:
    status, headers, after = answer(sock)
    assert status == status_wanted, (status, headers)
    assert b"connection: close" in headers, headers
    assert after == b""  # and the connection closed after it


@contextlib.contextmanager
def held(models_dir, direct: bool, nth: int = 1):
    """(server, its `nth` execute held until the gate is set, the gate, a list of client sockets
    closed after); `direct`: direct_infer."""
    gate = threading.Event()
    config = server_config(models_dir, model_control_mode="none", direct_infer=direct)
    srv = ServerThread(config).start()
    sockets = []
    try:
        yield srv, faults.inject("execute", nth=nth, hold=gate), gate, sockets
    finally:
        for sock in sockets:
            sock.close()
        gate.set()
        srv.close()
    assert srv.error is None, srv.error


@pytest.fixture(params=[True, False], ids=["direct", "aiohttp"])  # the guard's answers; aiohttp's
def held_server(request, models_dir, clean_faults):
    with held(models_dir, request.param) as made:
        yield made


def test_an_answer_in_flight_when_the_drain_begins_says_connection_close(held_server):
    srv, held, gate, sockets = held_server
    running = ask(srv.url)
    sockets.append(running)
    held.entered.wait(60)  # its batch runs (and holds the model)
    drain_begun(srv)
    gate.set()
    closed_after(running, b"HTTP/1.1 200 OK")
