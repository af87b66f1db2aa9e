"""The CPU compile's work folder in the temp folder (ONNX Runtime's optimiser writes its model
there: as large as the model). A compile killed outright (the kernel's out-of-memory killer
picks it: the compile is the memory peak) cannot remove it, so each folder is locked while its
compile lives (flock on LOCK inside it, as runtime/kept_file.py locks its copies: the kernel's
lock, released with the process, seen by every process sharing the temp folder, whatever PID
namespace), and each compile first removes the folders no live compile holds. A folder without
LOCK (made by an aclserve from before this, or by a compile killed in the instant between
making it and locking it) is left alone: nothing tells whether its compile still runs."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "aclserve-compile-"
LOCK = ".lock"


@contextlib.contextmanager
def work_folder():
    """A new folder in the temp folder, locked for the with-block and removed after it."""
    remove_dead()
    while True:
        folder = tempfile.mkdtemp(prefix=PREFIX)
        lock = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.fstat(lock).st_nlink:
            break
        os.close(lock)  # removed by another compile's sweep before it was locked: another one
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


def remove_dead() -> int:
    """Remove the work folders whose compile is gone (their LOCK held by no process); how many."""
    root = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(PREFIX)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        folder = os.path.join(root, name)
        try:
            lock = os.open(os.path.join(folder, LOCK), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:  # no LOCK (or not a folder): left alone
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its compile lives
        except OSError:
            os.close(lock)
            continue
        try:
            if not os.path.islink(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        finally:
            os.close(lock)
    return removed
