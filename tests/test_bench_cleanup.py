"""A benchmark of tools/ stopped by SIGTERM stops its server and removes its temp folders, as a
Ctrl-C does (an independent tester: bench_overload.py, bench_trace.py and bench_priority.py left
`aclserve serve` running, in a session of its own, and /tmp/bench-* behind; only bench_server.py
turned SIGTERM into its cleanup, now tools/bench_run.py does for every tool that starts a
server). reload_rss.py and bench_runtime.py ended by the signal itself (a tester, t80): the first
left its server running and /tmp/reload-rss-* behind, and printed a traceback on a Ctrl-C, its
server interrupted too (the terminal's SIGINT reached it); the second left its compiled model."""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys

import pytest

from tests import REPO
from tests.processes import ChildrenSeen
from tests.serving import json_call, wait_until

INTERRUPTED = "{}: interrupted; its servers stopped and its temp folders removed\n"  # (all it says)


class Run:
    """tools/<tool>.py started as a user starts it, in a session of its own (a terminal's foreground
    group: a Ctrl-C goes to the whole of it), its temp folders in `tmp` (TMPDIR); its servers as seen."""

    def __init__(self, tool: str, options: list[str], tmp):
        self.tool, self.tmp = tool, tmp
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tools" / f"{tool}.py"), *options],
                                     env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO)),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.servers = ChildrenSeen(self.proc.pid, " serve ")

    def server_ready(self) -> None:
        """Until its server has started and is ready."""
        wait_until(lambda: self.servers.look() or self.proc.poll() is not None, "a server started")
        assert self.servers, self.proc.communicate()
        port = int(re.search(r"--port (\d+)", next(iter(self.servers.values()))).group(1))
        wait_until(lambda: json_call(f"127.0.0.1:{port}", "/v2/health/ready")[0] == 200 or self.proc.poll() is not None,
                   "the server ready")

    def stopped(self, how: str) -> str:
        """Its stderr once stopped by a SIGTERM to it, or a Ctrl-C ("SIGINT": to its whole group), all
        of it checked gone (a hang guard of 90 s: a server drains in a second or so)."""
        assert os.listdir(self.tmp), "the tool's temp folders are not where TMPDIR says"
        try:
            if how == "SIGINT":
                os.killpg(self.proc.pid, signal.SIGINT)
            else:
                self.proc.send_signal(signal.SIGTERM)
            _, err = self.proc.communicate(timeout=90)
        finally:
            self.proc.kill()
            outlived = self.servers.killed_left()
        assert not outlived, "the server outlived its tool"
        assert os.listdir(self.tmp) == []
        assert self.proc.returncode == 130, err
        assert f"{self.tool}: interrupted" in err and "Traceback" not in err, err
        return err


@pytest.mark.skipif(not shutil.which("wrk") or not shutil.which("taskset"),
                    reason="bench_trace.py drives wrk, pinned with taskset")
def test_sigterm_stops_the_server_and_removes_the_temp_folders(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    run = Run("bench_trace", ["--rounds", "50", "--server-cpus", str(cpus[-1]), "--client-cpus", str(cpus[0])],
              tmp_path)
    run.server_ready()
    run.stopped("SIGTERM")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_reload_rss_stopped_mid_run_stops_its_server_and_removes_its_folder(how, tmp_path):
    if how == "SIGINT" and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        pytest.skip("SIGINT is ignored here, and so in the tool (a background job's)")
    run = Run("reload_rss", ["--reloads", "1000", "--clients", "1"], tmp_path)
    run.server_ready()
    assert run.stopped(how) == INTERRUPTED.format("reload_rss")


def test_bench_runtime_stopped_mid_run_removes_its_compiled_model(tmp_path):
    run = Run("bench_runtime", ["--gears", "1", "--seconds", "60"], tmp_path)
    # the table's header, flushed as the first cell starts (a hang guard: it takes a second or so)
    assert select.select([run.proc.stdout], [], [], 60)[0], "no table header"
    header = [run.proc.stdout.readline() for _ in range(2)]
    assert header[1].split()[:2] == ["gear", "raw"], (header, run.proc.communicate())
    assert run.stopped("SIGTERM") == INTERRUPTED.format("bench_runtime")
