"""A connection with no request under way when the drain ends is answered, unasked, the 503 "server
is shutting down" with `Connection: close` that a new connection gets then, and closed the lingering
way (lingering.py): what its client still sends is read and dropped, so a request written at that
instant reads the 503. It used to be closed bare: a tester's pooled client (4 workers posting infer
requests in a loop) had opened new connections during the drain, and a request written on one as
the drain ended met a reset (ServerDisconnectedError, ECONNRESET: 1-4 a run), its client unable to
know whether it ran. So is one idle when the drain began that sent nothing in its grace (idle_grace.py)
when the grace ends: it too was closed bare then. A real server in a thread, raw sockets; a held execute
keeps the drain going, and the lingering is made long where a request must come within it, so nothing
depends on timing."""
from __future__ import annotations

import asyncio
import select
import socket
import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.server import lingering
from tests.serving import ServerThread, server_config

from .hostile import read_answer_head
from .test_drain_connection_close import answer, ask, closed_after, draining, wait_until
from .test_drain_idle_grace import INFER, idle_after_an_answer

SHUTTING_DOWN = b'{"error":"server is shutting down"}'


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    """asyncio.run, or uvloop.run as `aclserve serve` runs (their transports shut and read apart)."""
    return asyncio.run if request.param == "asyncio" else pytest.importorskip("uvloop").run


@pytest.fixture
def long_linger(monkeypatch):
    monkeypatch.setattr(lingering, "LINGER_S", 600.0)  # a request must come within it: any time will do


@pytest.fixture
def drain_held(models_dir, clean_faults, run):
    """(server draining, held by a request whose execute waits for the gate, that request's socket, the
    gate, a connect() for connections opened now, during the drain): the drain ends once the gate opens."""
    gate = threading.Event()
    config = server_config(models_dir, model_control_mode="none", shutdown_timeout_s=600, header_timeout_s=600,
                           keepalive_timeout_s=600)
    srv = ServerThread(config, run=run).start()
    held = faults.inject("execute", nth=1, hold=gate)
    sockets = []

    def connect() -> socket.socket:
        host, port = srv.url.rsplit(":", 1)
        sockets.append(socket.create_connection((host, int(port)), timeout=60))  # (the timeout: a hang guard)
        # the server accepts in order: a connection opened after it is answered only once it has taken this one
        assert draining(srv.url)
        return sockets[-1]
    try:
        sockets.append(ask(srv.url))
        held.entered.wait(60)
        srv.begin_close()
        wait_until(lambda: draining(srv.url))
        yield srv, sockets[0], gate, connect
    finally:
        gate.set()
        for sock in sockets:
            sock.close()
        srv.close()
    assert srv.error is None, srv.error


def drain_ended(running: socket.socket, gate: threading.Event) -> None:
    gate.set()
    answer(running)  # its answer out, the drain ends (the server closes `running` after it)


def answered_503_closing(sock: socket.socket) -> None:
    """A whole 503 "server is shutting down", `Connection: close` and Retry-After, then the end."""
    status, headers, after = answer(sock)
    assert status == b"HTTP/1.1 503 Service Unavailable", (status, headers)
    assert b"connection: close" in headers and b"retry-after: 1" in headers, headers
    assert after == b""


def test_a_connection_opened_during_the_drain_that_sends_nothing_is_answered_503_as_it_ends(drain_held):
    srv, running, gate, connect = drain_held
    late = connect()
    drain_ended(running, gate)
    status, headers, rest, length = read_answer_head(late)  # (before: EOF, no answer)
    assert status == b"HTTP/1.1 503 Service Unavailable" and rest[:length] == SHUTTING_DOWN, (status, rest)
    assert b"connection: close" in headers and b"retry-after: 1" in headers, headers
    assert rest[length:] == b"" and late.recv(1) == b""


def test_a_request_written_as_the_drain_ends_reads_that_503_not_a_reset(drain_held, long_linger):
    srv, running, gate, connect = drain_held
    late = connect()
    drain_ended(running, gate)
    select.select([late], [], [], 60)  # the 503 has come (before: the close): the request is written after it
    late.sendall(INFER)
    answered_503_closing(late)
    late.sendall(INFER)  # still read (and dropped) by the server: no reset comes back
    assert late.recv(1) == b"" and late.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0


def test_a_request_head_still_coming_as_the_drain_ends_is_answered_503(drain_held, long_linger):
    """Its start, held back by the guard, reached nothing that answers: aiohttp has seen none of it."""
    srv, running, gate, connect = drain_held
    late = connect()
    late.sendall(INFER[:INFER.index(b"\r\n") + 2])  # the request line alone
    assert draining(srv.url)  # (read by now, as `late` was taken: in order)
    drain_ended(running, gate)
    select.select([late], [], [], 60)  # the 503 has come
    late.sendall(INFER[INFER.index(b"\r\n") + 2:])  # the rest, after it: read and dropped
    answered_503_closing(late)


def test_the_lingering_ends_by_the_shutdown_deadline(models_dir, clean_faults, long_linger):
    """A client that never closes its connection holds the exit until shutdown_timeout_s, not LINGER_S."""
    gate = threading.Event()
    config = server_config(models_dir, model_control_mode="none", shutdown_timeout_s=3, keepalive_timeout_s=600)
    srv = ServerThread(config).start()  # (aiohttp closes a connection idle for keepalive_timeout_s itself)
    held = faults.inject("execute", nth=1, hold=gate)
    running = ask(srv.url)
    late = None
    try:
        held.entered.wait(60)
        srv.begin_close()
        wait_until(lambda: draining(srv.url))
        host, port = srv.url.rsplit(":", 1)
        late = socket.create_connection((host, int(port)), timeout=60)
        assert draining(srv.url)
        gate.set()
        answered_503_closing(late)  # (the server's side shut: the end read; its socket stays open)
        srv._thread.join(60)  # a hang guard: LINGER_S is 600 s
        assert not srv._thread.is_alive()
    finally:
        gate.set()
        running.close()
        if late is not None:
            late.close()
        srv.close()
    assert srv.error is None, srv.error


@pytest.fixture
def idle_in_the_drain(models_dir, clean_faults, run):
    """(a keep-alive connection idle since before the drain began, a request whose execute waits for the
    gate and so keeps the drain going past the idle connection's grace, the gate)."""
    gate = threading.Event()
    config = server_config(models_dir, model_control_mode="none", shutdown_timeout_s=600, keepalive_timeout_s=600)
    srv = ServerThread(config, run=run).start()
    held = faults.inject("execute", nth=2, hold=gate)
    idle = idle_after_an_answer(srv.url)
    running = ask(srv.url)
    try:
        held.entered.wait(60)
        srv.begin_close()
        yield idle, running, gate
    finally:
        gate.set()
        idle.close(), running.close()
        srv.close()
    assert srv.error is None, srv.error


def test_an_idle_connection_that_sends_nothing_is_answered_503_as_its_grace_ends(idle_in_the_drain):
    """The grace ends while a request still holds the drain: the 503 comes then, not at the drain's end."""
    idle, running, gate = idle_in_the_drain
    answered_503_closing(idle)  # (before: EOF, no answer)
    gate.set()
    closed_after(running, b"HTTP/1.1 200 OK")


def test_a_request_written_as_the_grace_ends_reads_that_503_not_a_reset(idle_in_the_drain, long_linger):
    idle, running, gate = idle_in_the_drain
    select.select([idle], [], [], 60)  # the 503 has come as the grace ended (before: the close)
    idle.sendall(INFER)
    answered_503_closing(idle)
    idle.sendall(INFER)  # still read (and dropped) by the server: no reset comes back
    assert idle.recv(1) == b"" and idle.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
