"""tools/open_loop.py, the open-loop load of bench_overload.py: against the real server, it
counts each answer by status and the 200s' latency, whatever the server says."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import open_loop  # noqa: E402

ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                 {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}).encode()


def run(url: str, path: str, rate: float) -> dict:
    return asyncio.run(open_loop.run(f"http://{url}{path}", ONE_ROW, rate, seconds=1.0, warmup=0.2,
                                     headers=["Content-Type: application/json"], max_conns=50, timeout=5.0))


def test_answers_are_counted_by_status(server):
    served = run(server.url, "/v2/models/affine/infer", 100)
    assert served["per_s"].get("200", 0) > 0 and set(served["per_s"]) == {"200"}
    assert served["ok_per_s"] == served["per_s"]["200"]
    assert 0 < served["p50_ms"] <= served["p99_ms"]
    missing = run(server.url, "/v2/models/nope/infer", 100)
    assert missing["per_s"].get("404", 0) > 0 and missing["ok_per_s"] == 0


def open_loop_tool(url: str, body_file, *options: str) -> subprocess.CompletedProcess:
    """tools/open_loop.py run as bench_overload.py runs it (a process of its own: it installs uvloop)."""
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "open_loop.py"), url, str(body_file), *options],
                          capture_output=True, text=True, timeout=60)  # (a hang guard: --rate -5 looped for ever)


def test_options_it_cannot_run_are_refused_in_one_line(tmp_path):
    """A rate of -5 looped for ever creating tasks, a rate or a window of 0 ended in a
    ZeroDivisionError traceback (an independent tester)."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    for option, value in (("--rate", "-5"), ("--rate", "0"), ("--seconds", "0"), ("--warmup", "-1"),
                          ("--timeout", "0"), ("--max-conns", "0")):
        options = {"--rate": "100", "--seconds": "0.2", option: value}
        ran = open_loop_tool("http://127.0.0.1:9/v2/models/affine/infer", body, *sum(options.items(), ()))
        assert ran.returncode == 2 and f"error: argument {option}: " in ran.stderr, (option, value, ran.stderr)
        assert "Traceback" not in ran.stderr and ran.stdout == "", (option, value, ran.stderr)


def test_no_answer_is_no_figure_and_fails_the_run(tmp_path):
    """With nothing listening it printed ok_per_s 0.0, p50_ms 0.0, p99_ms 0.0 and exited 0: a
    latency of no answer is null, and a window without one 200 exits 1, saying why."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed: nothing listens there)
    ran = open_loop_tool(f"http://127.0.0.1:{port}/v2/models/affine/infer", body, "--rate", "50", "--seconds", "0.3",
                         "--warmup", "0")
    assert ran.returncode == 1, ran.stderr
    printed = json.loads(ran.stdout)
    assert printed["ok_per_s"] == 0 and printed["p50_ms"] is None and printed["p99_ms"] is None, printed
    assert printed["per_s"].get("connect error", 0) > 0, printed
    assert "no request of the window was answered 200" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
