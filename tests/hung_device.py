"""A device hang held by the CPU runtime's fault injection, or a launch held in its pack
(HeldRows), ended by the test."""
from __future__ import annotations

import threading
import time

import numpy as np

from aclserve.runtime import teardown


def let_go(gate: threading.Event) -> None:
    """Release the held execution, then wait until the abandoned instances are freed (a hang
    guard, not a timing: the device finishes at once)."""
    gate.set()
    for _ in range(3000):
        if teardown.release_recovered() == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"{teardown.held()} abandoned instance(s) never released")


class HeldRows:
    """Input rows whose packing waits for `gate`: numpy reads them through __array__ in the
    instance's launcher thread, which is then stuck inside the launch as on a hung memcpy_async
    or execute_async call."""

    def __init__(self, rows: np.ndarray, gate: threading.Event):
        self.rows, self.gate = rows, gate
        self.entered = threading.Event()

    def __len__(self) -> int:
        return len(self.rows)

    def __array__(self, dtype=None, copy=None):
        self.entered.set()
        self.gate.wait()
        return self.rows if dtype is None else self.rows.astype(dtype)
