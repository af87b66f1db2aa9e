"""The CPU time of this process's threads over a run, by what they do, and how long they waited
for a core (`aclserve profile` in-process; its summary: analysis.py).

A trace holds wall-clock times only: a span's duration counts the time its thread was preempted,
so shares of CPU are taken from each thread's own CPU time instead, read from Linux's
/proc/self/task/TID/schedstat (time on a CPU, time runnable but waiting in the run queue, in ns;
/proc/self/task/TID/stat's CPU ticks where the kernel has no schedstat: the wait is then not
known). Threads are grouped by the names the server gives them (runtime/instance_resources.py:
"INSTANCE-launch", "INSTANCE-complete"; acl/cpu/_stream.py: "acl-cpu-stream-HANDLE"); the CPU of
threads that ended during the run is the process's CPU time no living thread accounts for. The
cores it may use are its affinity's, or fewer under a CPU quota (cpu_quota.py), whose throttling
over the run is read too: a throttled thread waits in the run queue as one preempted does.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from . import cpu_quota

EVENT_LOOP = "event loop (decode, batching, encode)"
LAUNCHERS = "launchers (pack)"
COMPLETERS = "completers (unpack)"
STREAMS = "CPU runtime streams (compute, copies)"
NATIVE = "native threads"  # not started by Python: ONNX Runtime's or CANN's own
OTHER = "other threads"
ENDED = "threads that ended"
_TASKS = "/proc/self/task"
_TICK_NS = 1e9 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True)
class HostCpu:
    """What the process's threads took of the host over `seconds` of wall-clock time."""
    seconds: float
    cpu_s: float  # the process's CPU time: the sum of `roles` when they are known
    cores: float  # the cores the process may run on: its affinity's, or its CPU quota when fewer
    roles: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds; empty: threads not readable
    waited_s: float | None = None  # summed over threads: runnable, waiting for a core; None: not known
    quota: float | None = None  # its cgroups' CPU quota in cores; None: none set (or not readable)
    throttled_s: float | None = None  # how long that quota throttled it over the run; None: not known

    @property
    def used(self) -> float:
        """Cores used on average over the run."""
        return self.cpu_s / self.seconds if self.seconds > 0 else 0.0


def _read(tid: str) -> tuple[int, int | None] | None:
    """(CPU ns, run-queue wait ns or None) of thread `tid`; None when it is gone or unreadable."""
    try:
        with open(f"{_TASKS}/{tid}/schedstat") as f:
            on_cpu, waited = f.read().split()[:2]
        return int(on_cpu), int(waited)
    except FileNotFoundError:
        if not os.path.exists(f"{_TASKS}/{tid}"):
            return None  # (it ended)
    except (OSError, ValueError):
        pass
    try:  # (a kernel without schedstat: CPU ticks only)
        with open(f"{_TASKS}/{tid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # (the name, in parentheses, may hold spaces)
        return round((int(fields[11]) + int(fields[12])) * _TICK_NS), None
    except (OSError, ValueError, IndexError):
        return None


def _threads() -> dict[int, tuple[int, int | None]]:
    try:
        tids = os.listdir(_TASKS)
    except OSError:  # (not Linux)
        return {}
    read = {int(tid): _read(tid) for tid in tids if tid.isdigit()}
    return {tid: times for tid, times in read.items() if times is not None}


def _role(tid: int, loop_tid: int, names: dict[int, str]) -> str:
    name = names.get(tid)
    if tid == loop_tid:
        return EVENT_LOOP
    if name is None:
        return NATIVE
    if name.endswith("-launch"):
        return LAUNCHERS
    if name.endswith("-complete"):
        return COMPLETERS
    if name.startswith("acl-cpu-stream-"):
        return STREAMS
    return OTHER


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CpuMeter:
    """Started on the event loop's thread (it is named so); stop() gives what the process's
    threads took since."""

    def __init__(self):
        self._loop_tid = threading.get_native_id()
        self._quota = cpu_quota.read()
        self._throttled0 = cpu_quota.throttled_s(self._quota)
        self._start = _threads()
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()

    def stop(self) -> HostCpu:
        seconds = time.perf_counter() - self._wall0
        cpu_s = time.process_time() - self._cpu0
        end = _threads()
        names = {t.native_id: t.name for t in threading.enumerate()}
        throttled = self._throttled()
        quota = self._quota.cores if self._quota else None
        cores = _affinity() if quota is None else min(_affinity(), quota)
        if not end:
            return HostCpu(seconds, cpu_s, cores, quota=quota, throttled_s=throttled)
        roles: dict[str, float] = {}
        waited: float | None = 0.0
        for tid, (on_cpu, wait) in end.items():
            on_cpu0, wait0 = self._start.get(tid, (0, 0))  # (a thread started during the run: all of it)
            role = _role(tid, self._loop_tid, names)
            roles[role] = roles.get(role, 0.0) + max(0, on_cpu - on_cpu0) / 1e9
            if waited is not None:
                waited = None if wait is None or wait0 is None else waited + max(0, wait - wait0) / 1e9
        traced = sum(roles.values())
        if cpu_s - traced >= 1e-3:  # (the process's CPU time counts threads that ended: no file says theirs)
            roles[ENDED] = cpu_s - traced
        return HostCpu(seconds, sum(roles.values()), cores, roles, waited, quota, throttled)  # (the shares add up)

    def _throttled(self) -> float | None:
        end = cpu_quota.throttled_s(self._quota)
        return None if end is None or self._throttled0 is None else max(0.0, end - self._throttled0)
