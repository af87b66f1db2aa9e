"""tools/bench_run.run_tool: a measurement's failure ends a benchmark in one line and exit status 1,
a bug of the tool with its traceback (every RuntimeError was one `tool: error:` line, so a
NotImplementedError or RecursionError of a tool's own code said nothing of where: found in review)."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_common  # noqa: E402
import bench_wrk  # noqa: E402
from bench_run import BenchFailed, run_async, run_tool  # noqa: E402


class MeasuredFailure(Exception):
    """One a tool names as its measurement's (bench_batching: its runtime's errors)."""


def _raises(error: BaseException):
    def body() -> int:
        raise error
    return body


@pytest.mark.parametrize("error", [
    BenchFailed("the server was killed by signal 9 during default"),
    ConnectionRefusedError(111, "Connection refused"),
    subprocess.CalledProcessError(2, ["taskset", "-c", "9", "true"]),
], ids=["bench-failed", "os-error", "called-process"])
def test_a_measurements_failure_is_one_line_and_exit_status_1(error, capsys):
    assert run_tool("bench_x", _raises(error)) == 1
    err = capsys.readouterr().err
    assert err == f"bench_x: error: {error}\n", err


def test_the_errors_a_tool_names_as_its_measurements_are_one_line_too(capsys):
    assert run_tool("bench_x", _raises(MeasuredFailure("acl.mdl.execute failed")), (MeasuredFailure,)) == 1
    assert capsys.readouterr().err == "bench_x: error: acl.mdl.execute failed\n"


@pytest.mark.parametrize("bug", [NotImplementedError("todo"), RecursionError("maximum recursion depth exceeded"),
                                 RuntimeError("a tool's own"), MeasuredFailure("not named by this tool")])
def test_a_bug_of_the_tool_keeps_its_traceback(bug):
    with pytest.raises(type(bug)):
        run_tool("bench_x", _raises(bug))


def test_a_server_that_exits_before_it_is_ready_ends_the_run_in_one_line(tmp_path, capsys):
    """bench_common's and bench_wrk's failures (a server that exits or is never ready, wrk failing) are BenchFailed."""
    server = bench_common.ManagedProcess([sys.executable, "-c", "import sys; print('no models'); sys.exit(3)"],
                                         str(tmp_path / "server.log"))
    try:
        assert run_tool("bench_x", lambda: bench_common.wait_ready(server, "http://127.0.0.1:9", 60)) == 1
    finally:
        server.close()
    assert capsys.readouterr().err == "bench_x: error: server exited with 3:\nno models\n"


@pytest.mark.skipif(not shutil.which("wrk") or not shutil.which("taskset"), reason="wrk, pinned with taskset")
def test_wrk_failing_ends_the_run_in_one_line(tmp_path, capsys):
    wrk = bench_wrk.Wrk(str(min(os.sched_getaffinity(0))))
    body = bench_wrk.Body(b"{}", "application/json")
    try:
        assert run_tool("bench_x", lambda: wrk.run("not a url", body, 1, 1.0)) == 1
    finally:
        wrk.close()
    assert capsys.readouterr().err.startswith("bench_x: error: wrk failed (")


# In a process of its own: a test worker's SIGTERM may be its runner's (pytest-xdist's), whose own
# handler then ended the worker, and the suite's run with it (in CI; sigterm_as_interrupt leaves a
# handler it did not install in place)
_SIGTERM_IN_A_TASK = """
import asyncio, gc, logging, os, signal, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from bench_run import run_async, sigterm_as_interrupt
unwound = []


async def signalled():
    os.kill(os.getpid(), signal.SIGTERM)  # (its handler runs here, in this task's step)


async def run():
    task = asyncio.create_task(signalled())
    try:
        await asyncio.sleep(120)  # (a hang guard: cancelled at once)
    finally:
        unwound.append(task.done())

sigterm_as_interrupt()
try:
    run_async(run())
except KeyboardInterrupt:
    gc.collect()  # (an unretrieved exception is logged when its task goes)
    print(unwound)
"""


def test_a_sigterm_while_a_task_runs_unwinds_the_coroutine_and_is_an_interruption():
    """bench_run.run_async, as attack_server.py and grpc_slow_senders.py run their clients: the
    KeyboardInterrupt of sigterm_as_interrupt, raised in whichever task of asyncio.run's loop was
    running, left "Task exception was never retrieved" and its traceback after the tool's
    "interrupted" line (found in review). Now the signal cancels the run's coroutine, whose
    cleanup runs, and then is the KeyboardInterrupt run_tool ends on."""
    run = subprocess.run([sys.executable, "-c", _SIGTERM_IN_A_TASK, str(REPO)], capture_output=True, text=True,
                         timeout=120)
    assert (run.returncode, run.stdout, run.stderr) == (0, "[True]\n", ""), run.stderr


# A SIGTERM landing while asyncio.run builds its loop (placed there: sent from inside new_event_loop)
_SIGTERM_AS_THE_LOOP_IS_BUILT = """
import asyncio, gc, os, signal, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from bench_run import run_async, run_tool
built = asyncio.events.new_event_loop


def signalled_while_built():
    os.kill(os.getpid(), signal.SIGTERM)
    return built()


asyncio.events.new_event_loop = signalled_while_built
ran = []


async def run():
    ran.append(True)
    await asyncio.sleep(120)  # (a hang guard: cancelled at once)


code = run_tool("bench_x", lambda: run_async(run()))
gc.collect()  # (a half-built loop's and an unawaited coroutine's warnings come when they go)
print(code, ran)
"""


def test_a_sigterm_while_the_loop_is_built_is_one_interruption_line():
    """A full suite's run of grpc_slow_senders, signalled as it started its clients: the
    KeyboardInterrupt raised inside asyncio's loop construction left a half-built loop whose
    __del__ printed a traceback, and two "coroutine ... was never awaited" warnings, after the
    tool's line. Now the signal is held back until the loop can take it: the run's coroutine
    starts, is cancelled, and the run ends in the one line."""
    run = subprocess.run([sys.executable, "-c", _SIGTERM_AS_THE_LOOP_IS_BUILT, str(REPO)], capture_output=True,
                         text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, "130 [True]\n"), run.stderr
    assert run.stderr == "bench_x: interrupted; its servers stopped and its temp folders removed\n"


def test_run_async_runs_a_coroutine_outside_the_main_thread():
    """As asyncio.run does (a tool's run in a test's thread, tools/soak.py's): the loop took the
    signals where none can be taken, and raised RuntimeError instead of running it."""
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(run_async(answer())))
    thread.start()
    thread.join(60)  # (a hang guard)
    assert outcome == [42]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # (left as they were)
