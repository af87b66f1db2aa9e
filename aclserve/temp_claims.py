"""Entries of a folder (the temp folder unless said) a live process claims with flock, and the
sweep of those left by processes killed outright (the OOM killer, SIGKILL), which could not
remove them. flock is the kernel's: released with its process, seen by every process sharing the
folder, whatever PID namespace (a pid is not). Three users: the rebuilds' model copies
(runtime/kept_file.py, the entry its own lock), the CPU compile's work folders (om/work_folder.py)
and ATC's beside its output (om/atc.py), folders with a lock file inside (claimed_folder)."""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from typing import Callable

LOCK = ".lock"  # a claimed folder's lock file, inside it


def claimed(fd: int) -> bool:
    """Lock the new entry `fd` is open on (waiting for a sweep that holds it); False when a sweep
    removed it before it was locked (made, then swept before its lock: make another)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    return os.fstat(fd).st_nlink > 0


def claimed_folder(prefix: str, root: str | None = None) -> tuple[str, int]:
    """A new folder named `prefix`... in `root` (None: the temp folder) and the descriptor of the
    LOCK inside it, locked: the claim holds while that descriptor is open, in this process or in
    one it was passed to. Close it after removing the folder (sweep_unclaimed_folders)."""
    while True:
        folder = tempfile.mkdtemp(prefix=prefix, dir=root)
        try:
            lock = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        try:
            if claimed(lock):
                return folder, lock
        except OSError:  # (a filesystem without flock: the folder is not left behind for it)
            shutil.rmtree(folder, ignore_errors=True)
            os.close(lock)
            raise
        os.close(lock)  # removed by another process's sweep before it was locked: another one


def sweep_unclaimed_folders(prefix: str, root: str | None = None) -> int:
    """Remove the folders claimed_folder made in `root` whose process is gone; how many."""
    return sweep_unclaimed(prefix, "", lambda folder: os.path.join(folder, LOCK), _remove_folder, root)


def _remove_folder(folder: str) -> bool:
    if os.path.islink(folder):  # (a link named like one: not ours)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def sweep_unclaimed(prefix: str, suffix: str, lock_of: Callable[[str], str], remove: Callable[[str], bool],
                    root: str | None = None) -> int:
    """Remove the entries of `root` (None: the temp folder) named `prefix`...`suffix` whose lock
    (`lock_of(path)`) no process holds, with `remove(path)` (whether it removed it; an OSError
    counts as not); how many. An entry without a lock is left alone: nothing tells whether its
    process still runs."""
    root = tempfile.gettempdir() if root is None else root
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
