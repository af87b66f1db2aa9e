"""A device hang held by the CPU runtime's fault injection, or a launch held in its pack
(HeldRows), ended by the test; and the short execution timeout that only the held batch's
instance waits with (short_timeout_only_on)."""
from __future__ import annotations

import threading
import time

import numpy as np

from aclserve.runtime import teardown

# The execution timeout of every batch not meant to time out: no ordinary batch comes near it,
# however loaded the machine (with a short one, a retry or a rebuilt instance's batch could time out).
GENEROUS_TIMEOUT_MS = 60_000


def let_go(gate: threading.Event) -> None:
    """Release the held execution, then wait until the abandoned instances are freed (a hang
    guard, not a timing: the device finishes at once)."""
    gate.set()
    for _ in range(3000):
        if teardown.release_recovered() == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"{teardown.held()} abandoned instance(s) never released")


def short_timeout_only_on(pool, lane: int = 0) -> None:
    """Keep the short execution timeout `pool` was opened with on instance `lane` alone, the one
    whose held batch is meant to run into it; the other instances and every instance a rebuild
    makes (given the pool's value) wait GENEROUS_TIMEOUT_MS. Call it right after open_pool, before
    the hang (set_execution_timeout() cannot: it sets every instance, the held one's too). Opened
    with the short value, that instance's completion thread also watches launches at its pace."""
    pool.execution_timeout_ms = GENEROUS_TIMEOUT_MS
    for k, instance in enumerate(pool.instances):
        if k != lane:
            instance.execution_timeout_ms = GENEROUS_TIMEOUT_MS


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
