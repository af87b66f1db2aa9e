"""The CPU quota Linux's cgroups give this process, in cores, and how long it held the process
back (`aclserve profile` in-process: host_cpu.py).

A container's CPU limit (docker --cpus, Kubernetes limits.cpu) is a CFS quota: QUOTA us of CPU
every PERIOD us, in cgroup v2's cpu.max ("30000 100000"; "max 100000": none) or v1's
cpu.cfs_quota_us and cpu.cfs_period_us (-1: none). A process that spends it is throttled to the
end of the period, its threads runnable yet not running, as on a core other processes hold: so the
cores it may use are the fewer of its affinity's and QUOTA / PERIOD, and cpu.stat's throttled time
(v2 throttled_usec, v1 throttled_time in ns) says how long the quota held it back. The limit of
every cgroup from the process's own (/proc/self/cgroup) up to its hierarchy's root applies, so
the tightest is its quota; the hierarchies are found where /proc/self/mountinfo says they are
mounted (a container's is its own cgroup, mounted as the root: paths are taken relative to it).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

PROC = "/proc/self"


@dataclass(frozen=True)
class Quota:
    """The tightest CPU quota on the process's cgroup paths, and the cpu.stat files of every
    cgroup there with a quota of its own (each throttles the process when its own runs out)."""
    cores: float  # QUOTA / PERIOD
    stats: tuple[tuple[str, int], ...]  # (cpu.stat path, cgroup version)


def _unescape(path: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _mounts(proc: str) -> list[tuple[int, str, str]]:
    """(cgroup version, the cgroup mounted at its root, mount point) of v2 hierarchies and of v1's
    holding the cpu controller."""
    out = []
    with open(f"{proc}/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, fs = head.split(), tail.split()
            if len(fields) < 5 or len(fs) < 3:
                continue
            if fs[0] == "cgroup2":
                out.append((2, _unescape(fields[3]), _unescape(fields[4])))
            elif fs[0] == "cgroup" and "cpu" in fs[2].split(","):
                out.append((1, _unescape(fields[3]), _unescape(fields[4])))
    return out


def _cgroups(proc: str) -> dict[int, str]:
    """The process's cgroup path in the v2 hierarchy and in v1's cpu controller."""
    paths = {}
    with open(f"{proc}/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if number == "0" and controllers == "":
                paths[2] = path
            elif "cpu" in controllers.split(","):
                paths[1] = path
    return paths


def _folders(mount_root: str, mount_point: str, path: str) -> list[str]:
    """The cgroup folders from the process's up to the mount point: those not there are skipped
    by the reader (a path outside the mounted root, as a container sees its host's, is the root)."""
    root = mount_root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        path = path[len(root):]
    elif root:
        path = ""
    parts = [p for p in path.split("/") if p]
    return [os.path.join(mount_point, *parts[:n]) for n in range(len(parts), -1, -1)]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _limit(folder: str, version: int) -> float | None:
    """The folder's own quota in cores; None: none set or not readable."""
    try:
        if version == 2:
            text = _read(os.path.join(folder, "cpu.max"))
            quota, period = text.split()[:2] if text else ("max", "1")
            return None if quota == "max" else int(quota) / int(period)
        quota = _read(os.path.join(folder, "cpu.cfs_quota_us"))
        period = _read(os.path.join(folder, "cpu.cfs_period_us"))
        if quota is None or period is None or int(quota) < 0:
            return None
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def read(proc: str = PROC) -> Quota | None:
    """The process's CPU quota; None when it has none, or none is readable (not Linux, no cgroups)."""
    try:
        mounts, paths = _mounts(proc), _cgroups(proc)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    tightest, stats = None, []
    for version, mount_root, mount_point in mounts:
        if version not in paths:
            continue
        for folder in _folders(mount_root, mount_point, paths[version]):
            cores = _limit(folder, version)
            if cores is not None and cores > 0:
                tightest = cores if tightest is None else min(tightest, cores)
                stats.append((os.path.join(folder, "cpu.stat"), version))
    return None if tightest is None else Quota(tightest, tuple(stats))


def throttled_s(quota: Quota | None) -> float | None:
    """Seconds the quota's cgroups have been throttled, summed (each over the CPUs its throttling
    stopped); None when there is no quota or no cpu.stat says it."""
    if quota is None:
        return None
    total, known = 0.0, False
    for path, version in quota.stats:
        key, scale = ("throttled_usec", 1e-6) if version == 2 else ("throttled_time", 1e-9)
        for line in (_read(path) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                total, known = total + int(value) * scale, True
    return total if known else None
