"""Linux's PR_SET_PDEATHSIG, for the processes of a compile that must not outlive their starter:
the compile child (compile_child.py) and ATC's leash and ATC (atc_leash.py).

The kernel sends the signal when the thread that started the process ends, not its whole
process: each starter here waits in that thread for the process, so only its death ends it first.
Imports only the standard library: atc_leash.py runs it before every ATC build.
"""
from __future__ import annotations

import ctypes
import functools
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int) -> bool:
    """Have the kernel send `signum` to this process when its starter's thread ends. False where it
    cannot be told (not Linux, no prctl in the C library, or prctl refused): the caller's other
    watches alone then."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _prctl()(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no C library symbol to be had
        return False


@functools.cache
def _prctl():
    """libc's prctl, looked up once: the leash's first call finds it before it forks ATC's process,
    which calls it again between fork and exec."""
    return ctypes.CDLL(None, use_errno=True).prctl
