"""A command started with fd 0, 1 or 2 closed (`aclserve serve <&-`, `>&-`, `2>&-`): a real
`aclserve serve` process. Before, libuv's epoll fd (grpc's) took the free low fd and libuv
asserted on closing it: "uv__close: Assertion `fd > STDERR_FILENO' failed.", exit 134 (SIGABRT)
after "runtime closed", and on a busy port before its error line was written (a tester's find)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port

STREAMS = {0: "stdin", 1: "stdout", 2: "stderr"}


def _serve(folder, port: int, closed: int) -> subprocess.Popen:
    """`aclserve serve` on `port` with fd `closed` closed, its stderr a pipe unless that is the one closed."""
    return leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", "models", "--port", str(port),
                          "--grpc-port", "0", "--device", "cpu"], cwd=folder, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: os.close(closed))


def _ready(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).close()
    except OSError:
        return False
    return True


def _ready_then_stopped(proc: subprocess.Popen, port: int) -> str:
    """The stderr of `proc` once it was ready (or ended) and then stopped by SIGTERM; killed on a failure."""
    with proc:  # (its exit waits for the process)
        try:
            while proc.poll() is None and not _ready(port):
                time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()[1]
            proc.send_signal(signal.SIGTERM)
            return proc.communicate(timeout=120)[1]
        except BaseException:
            proc.kill()
            raise


@pytest.mark.parametrize("closed", sorted(STREAMS), ids=STREAMS.values())
def test_serve_started_with_a_standard_fd_closed_stops_cleanly_on_sigterm(tmp_path, closed):
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models")
    port = free_port()
    proc = _serve(tmp_path, port, closed)
    stderr = _ready_then_stopped(proc, port)
    assert proc.returncode == 0, stderr
    assert "Assertion" not in stderr and (closed == 2 or "runtime closed" in stderr), stderr


@pytest.mark.parametrize("closed", sorted(STREAMS), ids=STREAMS.values())
def test_serve_started_with_a_standard_fd_closed_says_its_port_is_busy(tmp_path, closed):
    (tmp_path / "models").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(tmp_path, port, closed)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    if closed != 2:  # (with stderr closed the line has nowhere to go; the status still says it)
        assert stderr.splitlines() == [f"aclserve serve: error: cannot listen on 127.0.0.1:{port}: Address already "
                                       "in use (--port PORT moves it)"], stderr
