"""A connection idle when the drain begins is kept open and read for a grace (idle_grace.py): a
request a pooled client sent on it at that instant gets a whole 503 "server is shutting down" with
`Connection: close`, where the connection used to be closed at once under it (a tester: a few
POST infers in thousands failed with ServerDisconnectedError or ECONNRESET under SIGTERM, their
client unable to know whether they ran). A real server in a thread, raw sockets; the grace is
made long where a request must come within it, so that nothing depends on timing. One that sends
nothing in its grace is answered 503 when the grace ends: test_drain_end_answers.py."""
from __future__ import annotations

import socket

import pytest

from aclserve.server import idle_grace
from tests.serving import ServerThread, server_config

from .hostile import read_answer_head
from .test_drain_connection_close import BODY, answer, ask, closed_after, drain_begun, held

INFER = (b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
CLOSING = b"HTTP/1.1 503 Service Unavailable"


def idle_after_an_answer(url: str) -> socket.socket:
    """A keep-alive connection whose infer request was answered 200: idle, as in a client's pool."""
    sock = ask(url)
    status, headers, rest, length = read_answer_head(sock)
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    assert status == b"HTTP/1.1 200 OK" and b"connection: close" not in headers, (status, headers)
    return sock


def infer_answered_closing(sock: socket.socket) -> None:
    """An infer request on `sock` gets 503 "server is shutting down", `Connection: close`, and the
    connection closes after it (before: EOF or a reset, no answer)."""
    sock.sendall(INFER)
    status, headers, after = answer(sock)
    assert status == CLOSING, (status, headers)
    assert b"connection: close" in headers, headers
    assert after == b""


@pytest.fixture
def long_grace(monkeypatch):
    monkeypatch.setattr(idle_grace, "GRACE_S", 600.0)  # a request must come within it: any time will do


@pytest.fixture(params=[True, False], ids=["direct", "aiohttp"])  # the idle connection's last answer: the guard's;
def second_held(request, models_dir, clean_faults):              # aiohttp's
    """(server, its second execute held until the gate is set, the gate, client sockets closed after)."""
    with held(models_dir, request.param, nth=2) as made:
        yield made


def test_a_request_on_a_connection_idle_as_the_drain_begins_is_answered_503_closing(second_held, long_grace):
    srv, held, gate, sockets = second_held
    idle = idle_after_an_answer(srv.url)
    sockets.append(idle)
    running = ask(srv.url)  # held in its execute: the drain goes on until the gate opens
    sockets.append(running)
    held.entered.wait(60)
    drain_begun(srv)
    infer_answered_closing(idle)
    gate.set()
    closed_after(running, b"HTTP/1.1 200 OK")


def test_a_drain_waits_for_its_idle_connections_no_longer_than_they_are_open(models_dir, long_grace):
    """Nothing in flight, a grace far longer than the test's hang guard: one idle connection asks
    and is answered, the other is closed by its client, and the server ends then, not at the
    grace's end (an idle server's shutdown is not held by it)."""
    srv = ServerThread(server_config(models_dir, model_control_mode="none", shutdown_timeout_s=600)).start()
    asking, leaving = idle_after_an_answer(srv.url), idle_after_an_answer(srv.url)
    try:
        drain_begun(srv)
        infer_answered_closing(asking)
        leaving.close()
        srv._thread.join(60)  # a hang guard: the grace is 600 s
        assert not srv._thread.is_alive()
    finally:
        asking.close(), leaving.close()
        srv.close()
    assert srv.error is None, srv.error
