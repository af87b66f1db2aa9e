"""The CPU compile's work folder in the temp folder (ONNX Runtime's optimiser writes its model
there: as large as the model). A compile killed outright (the kernel's out-of-memory killer
picks it: the compile is the memory peak) cannot remove it, so each folder is locked while its
compile lives (flock on a lock file inside it: temp_claims.claimed_folder, as ATC's work folders
and runtime/kept_file.py's copies), and each compile first removes the folders no live compile
holds. A folder without the lock file (made by an aclserve from before this, or by a compile
killed in the instant between making it and locking it) is left alone: nothing tells whether
its compile still runs."""
from __future__ import annotations

import contextlib
import os
import shutil

from ..temp_claims import claimed_folder, sweep_unclaimed_folders

PREFIX = "aclserve-compile-"


@contextlib.contextmanager
def work_folder():
    """A new folder in the temp folder, locked for the with-block and removed after it."""
    remove_dead()
    folder, lock = claimed_folder(PREFIX)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


def remove_dead() -> int:
    """Remove the work folders whose compile is gone (their lock held by no process); how many."""
    return sweep_unclaimed_folders(PREFIX)
