"""Entries of the temp folder a live process claims with flock, and the sweep of those left by
processes killed outright (the OOM killer, SIGKILL), which could not remove them. flock is the
kernel's: released with its process, seen by every process sharing the folder, whatever PID
namespace (a pid is not). Two users: the rebuilds' model copies (runtime/kept_file.py, the entry
its own lock) and the CPU compile's work folders (om/work_folder.py, a lock file inside)."""
from __future__ import annotations

import fcntl
import os
import tempfile
from typing import Callable


def claimed(fd: int) -> bool:
    """Lock the new entry `fd` is open on (waiting for a sweep that holds it); False when a sweep
    removed it before it was locked (made, then swept before its lock: make another)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    return os.fstat(fd).st_nlink > 0


def sweep_unclaimed(prefix: str, suffix: str, lock_of: Callable[[str], str], remove: Callable[[str], bool]) -> int:
    """Remove the temp folder's entries named `prefix`...`suffix` whose lock (`lock_of(path)`) no
    process holds, with `remove(path)` (whether it removed it; an OSError counts as not); how
    many. An entry without a lock is left alone: nothing tells whether its process still runs."""
    root = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(prefix) and name.endswith(suffix)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(root, name)
        try:
            fd = os.open(lock_of(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its process lives
            removed += remove(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed
