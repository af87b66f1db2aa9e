"""A SIGTERM that lands inside one of a benchmark's asyncio tasks ends it as one landing anywhere
else does (tools/bench_run.run_async): bench_batching.py's in-process run printed a second
traceback, or "Task exception was never retrieved", before its "interrupted" line, where the
signal's KeyboardInterrupt was raised in a submitter task (found in review: 2 of 12 SIGTERMs to
a tiny run). Here the signal is sent from inside such a task, so that it lands there every time."""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests import REPO
from tests.processes import ChildrenSeen
from tests.serving import wait_until
from tests.tiny_models import double_onnx


# In a process of its own: the signal goes to the process running the tool (a test worker's would be
# ended by it, as pytest-xdist's worker was, where the tool's handler is not installed off the main thread).
_RUN_INTERRUPTED = """
import logging, os, signal, sys, gc
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import bench_batching
import bench_batching_loops
from bench_run import run_tool
bench_batching.ensure_model = lambda name: sys.argv[2]  # (not built into out/models/)
logging.basicConfig(level=logging.WARNING)


def profile(frame, event, arg):  # SIGTERM as the main thread first enters a submitter task's request
    code = frame.f_code
    if event == "call" and code.co_name == "one" and code.co_filename == bench_batching_loops.__file__:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)


args = bench_batching.parse_args(["--model", "light", "--cpu", "-1", "--rounds", "1", "--concurrency", "4",
                                  "--capacity-seconds", "60"])
sys.setprofile(profile)
status = run_tool("bench_batching", lambda: bench_batching.bench(args), bench_batching.MEASURED)
sys.setprofile(None)
gc.collect()  # (an unretrieved exception is logged when its task goes)
sys.exit(status)
"""


def test_bench_batching_unwinds_a_sigterm_inside_a_submitter_task(tmp_path):
    double = double_onnx(tmp_path / "double.onnx")
    run = subprocess.run([sys.executable, "-c", _RUN_INTERRUPTED, str(REPO), str(double)], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert (run.returncode, run.stderr) == (
        130, "bench_batching: interrupted; its servers stopped and its temp folders removed\n"), run.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_priority_client_process_ends_quietly_on_an_interruption(signum):
    """`bench_batching.py priority` runs its clients as processes of the tool's process group, so a
    terminal's Ctrl-C reaches each of them: each printed a KeyboardInterrupt traceback (and a
    CancelledError's) before the tool's "interrupted" line (found in review); a SIGTERM ended one
    by its default action, with nothing unwound. Now both end a client with status 130 and no word
    (the tool's line says the run was interrupted). Its server here holds every request unanswered."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v2/models/heavy/infer"
        client = subprocess.Popen([sys.executable, str(REPO / "tools" / "bench_priority.py"), "client", "--url", url,
                                   "--clients", "2", "--start", repr(time.monotonic()), "--warm", "0",
                                   "--seconds", "120"],
                                  env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            assert select.select([listener], [], [], 120)[0], "the client never connected"  # (a hang guard)
            client.send_signal(signum)
            out, err = client.communicate(timeout=60)
        finally:
            client.kill()
    assert (client.returncode, out, err) == (130, "", "")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_bench_decoders_stops_the_candidate_it_measures(signum):
    """bench_decoders.py measures each decoder in a process of its own: a SIGTERM ended the tool
    by its default action and left that process (`--one pillow`) running for its ~30 s as an
    orphan, and a Ctrl-C printed a traceback (a tester, t80). Now both stop it and end the tool
    with one line, exit status 130."""
    pytest.importorskip("PIL")
    tool = subprocess.Popen([sys.executable, str(REPO / "tools" / "bench_decoders.py"), "--size", "8",
                             "--seconds", "60"], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    measuring = ChildrenSeen(tool.pid, " --one ")
    try:
        wait_until(lambda: measuring.look() or tool.poll() is not None, "a candidate measured")
        assert measuring, tool.communicate()
        tool.send_signal(signum)
        out, err = tool.communicate(timeout=60)
    finally:
        tool.kill()
        outlived = measuring.killed_left()
    assert not outlived, "the candidate's process outlived the tool"
    assert (tool.returncode, out, err) == (130, "", "bench_decoders: interrupted; its measuring process stopped\n")
