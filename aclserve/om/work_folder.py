"""The CPU compile's work folder in the temp folder (ONNX Runtime's optimiser writes its model
there: as large as the model). A compile killed outright (the kernel's out-of-memory killer
picks it: the compile is the memory peak) cannot remove it, so each folder is locked while its
compile lives (flock on LOCK inside it: temp_claims.py, as runtime/kept_file.py's copies), and
each compile first removes the folders no live compile holds. A folder without
LOCK (made by an aclserve from before this, or by a compile killed in the instant between
making it and locking it) is left alone: nothing tells whether its compile still runs."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from ..temp_claims import claimed, sweep_unclaimed

PREFIX = "aclserve-compile-"
LOCK = ".lock"


@contextlib.contextmanager
def work_folder():
    """A new folder in the temp folder, locked for the with-block and removed after it."""
    remove_dead()
    while True:
        folder = tempfile.mkdtemp(prefix=PREFIX)
        lock = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if claimed(lock):
            break
        os.close(lock)  # removed by another compile's sweep before it was locked: another one
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


def remove_dead() -> int:
    """Remove the work folders whose compile is gone (their LOCK held by no process); how many."""
    return sweep_unclaimed(PREFIX, "", lambda folder: os.path.join(folder, LOCK), _remove_folder)


def _remove_folder(folder: str) -> bool:
    if os.path.islink(folder):  # (a link named like one: not ours)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True
