"""ATC on a leash: on Linux, atc.run_streaming starts ATC through this program, so that ATC and
the processes it starts die with the process that runs it, however that process ends.

ATC runs in a process group of its own (its operator compiles are its children, in it), which
a timeout, a Ctrl-C or an exit ended. A process killed outright runs none of that: the compile
child the server SIGKILLs after its grace period, one the out-of-memory killer picks, `aclserve
compile` under `kill -9`; its ATC ran on until its timeout (an hour by default). This program
starts ATC as its child, in a new group, and ends it (SIGKILL to the group, ATC waited for) on
SIGTERM, which the kernel sends it when the thread that started it ends (PR_SET_PDEATHSIG:
parent_death.py; that thread waits for it, so only its process's death ends it first) and which
end() sends. It ends as ATC does: ATC's exit status, or killed by the same signal. ATC gets
SIGKILL from the kernel if this program is itself killed outright. ATC's stdin, stdout and
stderr are this program's.

`python -c CODE ROOT PARENT ATC ARGS...` (command() builds it: own_python.py): PARENT is the pid of
the process that starts it; one already gone before the kernel was told is seen, and ATC is never
started.
It makes itself, and so ATC, the out-of-memory killer's first pick (oom_first.py).
Imports only the standard library (and aclserve/__init__'s, and parent_death.py, oom_first.py, own_python.py
and secret_env.py, which import only the standard library too): it starts before every ATC build.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from . import oom_first, own_python
from .parent_death import die_with_parent

NOT_STARTED = 127  # its exit status when ATC could not be started (a shell's for a command it cannot run)


def leashed() -> bool:
    """Whether command() puts ATC on the leash here (Linux, with a Python executable to run it)."""
    return sys.platform.startswith("linux") and bool(sys.executable)


def command(argv: list[str]) -> list[str]:
    """The command that runs `argv` (ATC's) on the leash; `argv` itself where there is none."""
    if not leashed():
        return argv
    return own_python.command(__name__, str(os.getpid()), *argv)


def end(proc: subprocess.Popen) -> None:
    """End what command() started, in a session of its own: the leash's SIGTERM (it kills ATC's
    group and waits for ATC before it exits), or SIGKILL to ATC's group where there is no leash."""
    try:
        if leashed():
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def not_started(atc: str) -> str:
    """How the line it prints when ATC could not be started begins (the reason follows)."""
    return f"could not start ATC {atc}: "


def main(argv: list[str]) -> int:
    parent, atc_argv = int(argv[0]), argv[1:]
    ending, started = [], []

    def end_atc(_signum=None, _frame=None) -> None:
        ending.append(True)
        for atc in started:
            try:
                os.killpg(atc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, end_atc)  # (before the kernel may send it)
    oom_first.volunteer()  # ATC's memory goes first (the compile child's leash is there already; the Python API's not)
    if die_with_parent(signal.SIGTERM) and os.getppid() != parent:
        return 128 + signal.SIGTERM  # its starter died before the kernel was told: no ATC

    def in_own_group_dying_with_leash() -> None:  # (in ATC's process before it runs ATC)
        os.setpgid(0, 0)  # (Popen's process_group is Python 3.11's)
        die_with_parent(signal.SIGKILL)

    try:  # (preexec_fn is safe here: this process has one thread)
        started.append(subprocess.Popen(atc_argv, preexec_fn=in_own_group_dying_with_leash))
    except OSError as e:
        print(f"{not_started(atc_argv[0])}{e.strerror or e}", flush=True)
        return NOT_STARTED
    if ending:  # (SIGTERM while it started)
        end_atc()
    status = started[0].wait()
    if status < 0:  # killed by a signal: so is the leash, for its starter to see the same
        if -status != signal.SIGKILL:  # (SIGKILL has no handler to reset: setting one raises)
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # (a signal whose default is not to end the process)
    return status
