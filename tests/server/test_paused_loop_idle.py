"""A server stopped for longer than keepalive_timeout_s (SIGSTOP, as a tester, t87, did; a
debugger's stop is alike) closes no connection as idle for that time once it runs again
(SIGCONT): a request written on a kept-alive connection during the pause is answered, and a
connection idle through it is still served after it. Both were closed as the loop ran again,
before it read the request waiting: uvloop, which `aclserve serve` runs on, runs the timers due
(aiohttp's keep-alive timer and the tracker's sweep) before it polls the sockets once its wait is
interrupted. The sleep is the pause itself, which must outlast the keep-alive; nothing checks how
long anything takes. The server is a process of its own: the signals go to it alone."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.processes import leashed_popen
from tests.serving import free_port

from .test_shutdown_deadline import wait_serving

KEEPALIVE_S = 1.5
PAUSE_S = 4.0  # the server stopped, past the keep-alive
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
BODY = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"1.0"] * 16) + b"]}]}"
INFER = (b"POST /v2/models/double/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


@pytest.fixture
def server(models_dir, tmp_path):
    """The port of an `aclserve serve` (uvloop where installed) and its process, killed at the end."""
    pytest.importorskip("uvloop")
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(models_dir / "double.om", models / "double.om")
    port = free_port()
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nmodels_dir: {models}\n"
                                         f"model_control_mode: none\nkeepalive_timeout_s: {KEEPALIVE_S}\n")
    with open(tmp_path / "serve.log", "w") as log:
        proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(proc, port)
        yield port, proc
    finally:
        proc.kill()
        proc.wait(60)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def status(sock: socket.socket) -> int:
    """The next answer's status (its body read, by Content-Length); 0 when the server closed or reset."""
    got = b""
    with contextlib.suppress(ConnectionError):
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            if not chunk:
                return 0
            got += chunk
        head, rest = got.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return 0
            rest += chunk
        return int(head.split(b" ", 2)[1])
    return 0


def stopped(pid: int, task: str) -> bool:
    """Whether a thread of the process is stopped (/proc's state T, or t)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("t", "T")
    return True  # (a thread that ended meanwhile)


@contextlib.contextmanager
def paused(proc: subprocess.Popen):
    """The server stopped while the block runs, then PAUSE_S more, then running again."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        for _ in range(3000):  # a hang guard: until every thread has stopped (the signal is not taken at once)
            if all(stopped(proc.pid, task) for task in os.listdir(f"/proc/{proc.pid}/task")):
                break
            time.sleep(0.01)
        yield
        time.sleep(PAUSE_S)
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_a_request_written_during_a_pause_is_answered(server):
    port, proc = server
    with connect(port) as sock:
        sock.sendall(LIVE)
        assert status(sock) == 200  # kept alive, idle from here
        with paused(proc):
            sock.sendall(INFER)  # waits in the socket, unread, while the keep-alive runs out on the loop's clock
        assert status(sock) == 200


def test_a_connection_idle_through_a_pause_is_not_closed_for_it(server):
    port, proc = server
    with connect(port) as idle, connect(port) as other:
        for sock in (idle, other):
            sock.sendall(LIVE)
            assert status(sock) == 200
        with paused(proc):
            pass
        # `other` answered: the loop has polled its sockets since the pause, so the timers due in it have run
        other.sendall(LIVE)
        assert status(other) == 200
        idle.sendall(INFER)
        assert status(idle) == 200
