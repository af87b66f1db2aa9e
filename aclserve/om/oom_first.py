"""The kernel's out-of-memory killer picks a compile's processes first: the compile's child
(compile_child.py) and ATC's leash (atc_leash.py) each set their own oom_score_adj to 1000 as they
start, and what they start (ATC, its operator compiles) inherits it.

A compile's memory is its child's (5.1-5.3x the model's weights at its peak on the CPU runtime),
and the child inherited the server's score, 0, as any process does: in a memory-limited cgroup
(170 MB) a 44 MB .onnx dropped in had the kernel kill the server (133 MB resident) rather than
its compile (108 MB): every model down, no log line (tester t87). The kernel kills the process of
the highest score, its resident memory plus oom_score_adj thousandths of the memory it may use:
at 1000 the compile goes first whatever its size, and its version fails, `killed by SIGKILL`,
while the server serves on. Raising one's own score needs no privilege (lowering it needs
CAP_SYS_RESOURCE). Imports only the standard library: atc_leash.py runs it before every ATC build.
"""
from __future__ import annotations

import sys

SCORE_FILE = "/proc/self/oom_score_adj"
FIRST_PICK = 1000  # OOM_SCORE_ADJ_MAX


def volunteer() -> str | None:
    """Make this process, and those it starts from now on, the out-of-memory killer's first pick.
    None when done, or where there is no such setting (not Linux); else why it could not be set."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(SCORE_FILE, "w", encoding="ascii") as f:
            f.write(f"{FIRST_PICK}\n")
    except OSError as e:  # (no /proc, or one mounted read-only)
        return f"{SCORE_FILE}: {e.strerror or e}"
    return None
