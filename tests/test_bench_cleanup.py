"""A benchmark of tools/ stopped by SIGTERM stops its server and removes its temp folders, as a
Ctrl-C does (an independent tester: bench_overload.py, bench_trace.py and bench_priority.py left
`aclserve serve` running, in a session of its own, and /tmp/bench-* behind; only bench_server.py
turned SIGTERM into its cleanup, now tools/bench_run.py does for every tool that starts a
server)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests import REPO
from tests.processes import children, running
from tests.serving import json_call, wait_until

pytestmark = pytest.mark.skipif(not shutil.which("wrk") or not shutil.which("taskset"),
                                reason="bench_trace.py drives wrk, pinned with taskset")


def test_sigterm_stops_the_server_and_removes_the_temp_folders(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    tool = subprocess.Popen([sys.executable, str(REPO / "tools" / "bench_trace.py"), "--rounds", "50",
                             "--server-cpus", str(cpus[-1]), "--client-cpus", str(cpus[0])],
                            env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    servers: dict[int, str] = {}

    def server_started() -> bool:
        servers.update((pid, cmd) for pid, cmd in children(tool.pid).items() if " serve " in cmd)
        return bool(servers)

    try:
        wait_until(server_started, "a server started")
        port = int(re.search(r"--port (\d+)", next(iter(servers.values()))).group(1))
        wait_until(lambda: json_call(f"127.0.0.1:{port}", "/v2/health/ready")[0] == 200 or tool.poll() is not None,
                   "the server ready")
        assert os.listdir(tmp_path), "the tool's temp folders are not where TMPDIR says"
        tool.send_signal(signal.SIGTERM)
        _, err = tool.communicate(timeout=90)  # (a hang guard: the server drains in a second or so)
    finally:
        tool.kill()
        for pid in servers:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    assert not any(map(running, servers)), "the server outlived its tool"
    assert os.listdir(tmp_path) == []
    assert tool.returncode == 130, err
    assert "bench_trace: interrupted" in err and "Traceback" not in err, err
