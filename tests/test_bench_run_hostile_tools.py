"""tools/attack_server.py, loop_stalls.py, grpc_slow_senders.py and bench_images.py end as the other
benchmarks do (tools/bench_run.py): a SIGTERM stopped their server but printed a KeyboardInterrupt
traceback (a coroutine's "Task exception was never retrieved" among them), exited by SIGINT
rather than 130 and left the run's folder in /tmp; a server killed during the run gave a table
and exit status 0, or a traceback of the refused connection (found in review). Each tool runs as a
user starts it, in a tiny run, on a real server."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests import REPO
from tests.processes import ChildrenSeen
from tests.serving import json_call, wait_until

# bench_images.py drives wrk, and takes its photos from scikit-learn (the tools extra: `pip install -e '.[tools]'`)
WRK = pytest.mark.skipif(not shutil.which("wrk") or importlib.util.find_spec("sklearn") is None,
                         reason="bench_images.py needs wrk and scikit-learn (the tools extra)")
TOOLS = {  # tool -> (a tiny run's options, the model whose first answered request shows the run begun)
    "attack_server": (["--attacks", "idle", "--conns", "1", "--hold-s", "60"], "digits"),
    "loop_stalls": (["--cases", "grpc-params-bound", "--mb", "1"], "digits"),
    "grpc_slow_senders": (["--senders", "1", "--message-mb", "1", "--send-s", "60", "--hold-s", "60"], "digits"),
    "bench_images": (["--seconds", "1", "--latency-seconds", "1", "--rounds", "1", "--clients", "1",
                      "--images-per-request", "1"], "medium_image"),
}
PARAMS = [pytest.param(tool, marks=WRK if tool == "bench_images" else ()) for tool in TOOLS]


class Run:
    """One tool started as a user starts it, its temp folders in `tmp` (TMPDIR); its server once
    started (`server_pid`, `address`)."""

    def __init__(self, tool: str, tmp_path):
        self.tool, self.tmp = tool, tmp_path / "tmp"
        self.tmp.mkdir()
        options = TOOLS[tool][0] + (["--models-dir", str(tmp_path / "models")] if tool == "bench_images" else [])
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tools" / f"{tool}.py"), *options],
                                     env=dict(os.environ, TMPDIR=str(self.tmp), PYTHONPATH=str(REPO)),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.servers = ChildrenSeen(self.proc.pid, " serve ")

    def wait_for_the_server(self) -> None:
        wait_until(lambda: self.servers.look() or self.proc.poll() is not None, "a server started")
        assert self.servers, self.proc.communicate()
        self.server_pid, cmd = next(iter(self.servers.items()))
        port = re.search(r"--port (\d+)", cmd).group(1)
        self.address = f"127.0.0.1:{port}"

    def answered(self, model: str) -> bool:
        """Whether `model` has answered a request (the tool is past its wait for readiness), or the tool ended."""
        status, stats = json_call(self.address, f"/v2/models/{model}/stats")
        return (status == 200 and stats["model_stats"][0]["inference_stats"]["success"]["count"] > 0
                or self.proc.poll() is not None)

    def end(self) -> tuple[int, str]:
        """The tool's exit status and stderr once it has ended (a hang guard of 90 s: its server
        stops in a second or two)."""
        try:
            _, err = self.proc.communicate(timeout=90)
        finally:
            self.proc.kill()
            outlived = self.servers.killed_left()
        assert not outlived, "the server outlived its tool"
        return self.proc.returncode, err


@pytest.mark.parametrize("tool", PARAMS)
def test_sigterm_stops_the_server_removes_the_folders_and_exits_130(tool, tmp_path):
    run = Run(tool, tmp_path)
    run.wait_for_the_server()
    wait_until(lambda: json_call(run.address, "/v2/health/ready")[0] == 200 or run.proc.poll() is not None,
               "the server ready")
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.end()
    assert code == 130, err
    assert f"{tool}: interrupted" in err and "Traceback" not in err, err
    assert os.listdir(run.tmp) == []


@pytest.mark.parametrize("tool", PARAMS)
def test_a_server_killed_during_the_run_ends_it_in_one_error_line(tool, tmp_path):
    run = Run(tool, tmp_path)
    run.wait_for_the_server()
    wait_until(lambda: run.answered(TOOLS[tool][1]), "the run begun")
    os.kill(run.server_pid, signal.SIGKILL)
    code, err = run.end()
    assert code == 1, err
    assert err.startswith(f"{tool}: error: the server was killed by signal 9 during the "), err
    assert "Traceback" not in err, err
    assert os.listdir(run.tmp) == []
