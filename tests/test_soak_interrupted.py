"""tools/soak.py ends on Ctrl-C or SIGTERM as the benchmarks do (tools/bench_run.py): a SIGTERM
ended the tool by its default action, its server left running and its folder in /tmp, and a
Ctrl-C printed a KeyboardInterrupt traceback and left the folder (found in review). Now either
stops the server, removes the folder and exits 130 after one line. The tool runs as a user starts
it, in a short run, on a real server; the signal comes once its clients have been answered."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests import REPO
from tests.processes import ChildrenSeen
from tests.serving import json_call, wait_until


def _answered(address: str) -> bool:
    status, stats = json_call(address, "/v2/models/digits/stats")
    return status == 200 and stats["model_stats"][0]["inference_stats"]["success"]["count"] > 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interruption_stops_the_server_removes_the_folder_and_exits_130(signum, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, str(REPO / "tools" / "soak.py"), "--minutes", "2", "--clients", "2",
                             "--slow", "1", "--no-bombs", "--fault-probability", "0"],
                            env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    servers = ChildrenSeen(proc.pid, " serve ")
    try:
        wait_until(lambda: servers.look() or proc.poll() is not None, "a server started")
        assert servers, proc.communicate()
        address = "127.0.0.1:" + re.search(r"--port (\d+)", next(iter(servers.values()))).group(1)
        wait_until(lambda: proc.poll() is not None or _answered(address), "the soak's clients answered")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)  # (a hang guard: the server stops in a second or two)
    finally:
        proc.kill()
        outlived = servers.killed_left()
    assert not outlived, "the server outlived its tool"
    assert proc.returncode == 130, err
    assert err == "soak: interrupted; its servers stopped and its temp folders removed\n", err
    assert os.listdir(tmp) == []
