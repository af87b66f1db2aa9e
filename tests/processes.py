"""Processes as /proc shows them, for tests of tools that start their own (the benchmarks' servers
and load generators): a process's children with their command lines, and whether one runs."""
from __future__ import annotations

import os


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after "(comm)": [0] the state, [1] the parent's pid."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def children(pid: int) -> dict[int, str]:
    """The live children of `pid`: pid -> command line, its arguments joined by blanks."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat_fields(entry)[1]) == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError):
            pass  # (gone meanwhile)
    return found


def running(pid: int) -> bool:
    """Whether `pid` is there and not a zombie."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False
