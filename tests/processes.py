"""Processes as /proc shows them, for tests of tools that start their own (the benchmarks' servers
and load generators): a process's children with their command lines, and whether one runs; a
command run with every process it starts killed once it is done, itself once the test is gone
(run_as_group); and a process the kernel kills once the test that started it is gone, however it
went (leashed_popen: a script a test runs imports it too, to leash the server it starts to itself;
leashed_run: subprocess.run's way of it)."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# looked up here, in the test's process: a child forked from a process with threads must not dlopen
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after "(comm)": [0] the state, [1] the parent's pid."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def command_line(pid: int | str) -> str:
    """`pid`'s command line, its arguments joined by blanks; raises OSError once it is gone."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def children(pid: int) -> dict[int, str]:
    """The live children of `pid`: pid -> command line, its arguments joined by blanks."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat_fields(entry)[1]) == pid:
                found[int(entry)] = command_line(entry)
        except (OSError, IndexError):
            pass  # (gone meanwhile)
    return found


def running(pid: int) -> bool:
    """Whether `pid` is there and not a zombie."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


class ChildrenSeen(dict):
    """The children of `parent` whose command line holds `mark` (pid -> command line), each one
    `look()` has seen kept, for a test that stops a tool and checks they went with it."""

    def __init__(self, parent: int, mark: str):
        super().__init__()
        self.parent, self.mark = parent, mark

    def look(self) -> bool:
        """Whether any has been seen, those running now added."""
        self.update((pid, cmd) for pid, cmd in children(self.parent).items() if self.mark in cmd)
        return bool(self)

    def killed_left(self) -> list[int]:
        """Those still running, killed (SIGKILL): a test's cleanup, their list for its assertion."""
        left = [pid for pid in self if running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left


def kill_group_led_by(pid: int, mark: str) -> bool:
    """SIGKILL to the process group `pid` leads, if `pid` still runs with `mark` in its command line
    (not a pid reused since): for a process a test started in a session of its own, which killing the
    test's own group does not reach. Whether it was killed."""
    try:
        if not running(pid) or mark not in command_line(pid):
            return False
        os.killpg(pid, signal.SIGKILL)
    except (OSError, IndexError):  # (ProcessLookupError: gone meanwhile)
        return False
    return True


def run_as_group(command: list[str], timeout: float, **popen_args) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **popen_args), the
    command leading a process group of its own, every process left in it killed (SIGKILL) once it
    ends, times out or the wait fails. subprocess.run's timeout kills the command alone: a server
    it started in an `unshare` namespace was left running there, reached by nothing (orphans seen).
    The command is leashed too (leashed_popen): pytest-timeout's os._exit runs no `finally`, so
    no group kill; a script's own server dies with the script where it is leashed to it in turn."""
    with leashed_popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True, **popen_args) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # (the group's id is its leader's pid)
            except ProcessLookupError:
                pass  # (none left: the usual end)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def leashed_run(command: list[str], capture_output: bool = False, timeout: float | None = None,
                **popen_args) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=..., timeout=..., **popen_args) of a leashed_popen: the
    same CompletedProcess, and on a timeout the command killed (SIGKILL) and TimeoutExpired raised with
    what it wrote, as run does. For a server a test expects to refuse to start: a regression that made
    it serve outlived a run ended by pytest-timeout's os._exit."""
    if capture_output:
        popen_args["stdout"] = popen_args["stderr"] = subprocess.PIPE
    with leashed_popen(command, **popen_args) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            proc.kill()
            expired.stdout, expired.stderr = proc.communicate()  # (run's, whose TimeoutExpired holds them)
            raise
        except BaseException:  # (a KeyboardInterrupt in the wait: run kills it too)
            proc.kill()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def leashed_popen(command: list[str], **popen_args) -> subprocess.Popen:
    """subprocess.Popen(command, **popen_args), the process SIGKILLed by the kernel once the thread
    that started it ends (Linux's PR_SET_PDEATHSIG; a test's own thread: pytest's, which lasts the
    run). For the `aclserve serve` a test starts: pytest-timeout's thread method (pytest.ini) ends a
    hung test's run with os._exit, which runs no `finally` and no fixture's teardown, and a server
    left to those outlived the run (seen: a test of tests/server/test_memory_room_waits.py under a
    1 s timeout left its server running, its parent pid 1). A preexec_fn given runs after it."""
    parent, then = os.getpid(), popen_args.pop("preexec_fn", None)

    def dying_with_the_test() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # (the test gone before the prctl: no signal will come)
                os.kill(os.getpid(), signal.SIGKILL)
        if then is not None:
            then()
    return subprocess.Popen(command, preexec_fn=dying_with_the_test, **popen_args)
