"""A device hang held by the CPU runtime's fault injection, ended by the test."""
from __future__ import annotations

import threading
import time

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
