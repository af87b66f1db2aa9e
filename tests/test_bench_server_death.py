"""tools/bench_overload.py stops when its server dies (an independent tester: after a kill -9 of its
`aclserve serve` during a window it printed plausible figures, the dead port's refusals counted
as socket errors or "connect error"s only, and exited 0). Now every window is followed by the
check bench_server.py makes too (bench_run.ensure_running): the run ends in one error line."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading

import pytest

from tests import REPO
from tests.processes import children
from tests.serving import wait_until
from tests.tiny_models import compile_cpu_om, double_onnx

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_overload  # noqa: E402
from bench_run import BenchFailed  # noqa: E402
from bench_wrk import Body, Wrk  # noqa: E402

pytestmark = pytest.mark.skipif(not shutil.which("wrk") or not shutil.which("taskset"),
                                reason="bench_overload.py drives wrk, pinned with taskset")


def test_a_server_killed_during_a_window_ends_the_run(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    compile_cpu_om(double_onnx(tmp_path / "double.onnx"), repo / "medium.om", "1,2,4")  # (the tool's model name)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    body = Body(json.dumps(doc).encode(), "application/json")
    body_path = tmp_path / "body.json"
    body_path.write_bytes(body.data)
    cpus = sorted(os.sched_getaffinity(0))
    args = argparse.Namespace(server_cpus=str(cpus[-1]), client_cpus=str(cpus[0]), start_timeout=120.0,
                              capacity_conc=2, conc=[2], warmup=0.0, duration=1.0, open_loads=[2.0],
                              client_timeout=1.0)
    closers: list = []

    def kill_during_a_window():
        wait_until(lambda: closers, "the server started")
        wait_until(lambda: any(cmd.startswith("wrk ") for cmd in children(os.getpid()).values()), "a window begun")
        closers[0].proc.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_during_a_window, daemon=True)
    killer.start()
    wrk = Wrk(args.client_cpus, count_non2xx=True)
    try:
        with pytest.raises(BenchFailed, match="the server was killed by signal 9 during default "):
            bench_overload.run_setting("default", "", args, str(repo), body, str(body_path), wrk, str(tmp_path),
                                       closers)
    finally:
        killer.join(120)
        for closer in closers:
            closer.close()
        wrk.close()
