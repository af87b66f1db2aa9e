"""The Linux scheduling policy of a server's threads (`thread_scheduling`).

A request crosses threads that share Python's GIL: the event loop hands a batch to its
instance's launcher, the device (the CPU runtime's stream threads) to the completion thread,
that thread back to the loop. Under SCHED_OTHER a thread woken by another on the same core
preempts its waker at once, only to wait for the GIL the waker still holds: each hand-off
switches back and forth. Under SCHED_BATCH a woken thread preempts nothing (the tick still
shares the core fairly), so the waker runs on to its next blocking call, which lets the GIL go.
On a core of its own, one model: 5 context switches a light request at one client instead of
12, p50 0.33-0.34 ms instead of 0.40-0.41 (`tools/bench_server.py`). But a thread woken then
waits for any CPU-bound thread on its core to use up its slice, about a tick (4 ms): another
model's compute, a neighbour even at nice 19, ONNX Runtime on every core. So `batch` is a choice
for a server alone on its cores with one model, not the default. `aclserve serve` sets it at
start, for the threads there (numpy's BLAS starts some at import) and so for every thread and
process started after: a thread inherits its creator's policy.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

BATCH = "batch"  # (the other choice, "inherited", leaves the policy as started)


def apply(choice: str) -> str | None:
    """For `batch`: SCHED_BATCH for the calling thread, so for the threads started after, and for
    those the process has already (numpy's BLAS starts some at import), each taken from
    SCHED_OTHER only (with or without the reset-on-fork flag, which is dropped): a policy someone
    chose (chrt: batch, real-time, idle) is kept, and said. The calling thread's policy now in
    force, by name; None where the platform has no such call."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_BATCH"):
        return None
    current = _policy(0)
    if choice != BATCH:
        return name(current)
    if current != os.SCHED_OTHER:
        if current != os.SCHED_BATCH:
            log.info("thread_scheduling: batch not set: the server was started under %s, which is kept",
                     name(current))
        return name(current)
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as e:  # (never refused for one's own thread on Linux; a sandbox might)
        log.warning("thread_scheduling: batch could not be set (%s); the threads keep SCHED_OTHER", e)
        return name(current)
    for tid in _other_threads():
        try:
            if _policy(tid) == os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass  # ended meanwhile
    log.info("thread_scheduling: batch: the server's threads run under SCHED_BATCH")
    return name(os.SCHED_BATCH)


def _policy(tid: int) -> int:
    """A thread's policy without the reset-on-fork flag (`chrt -R` sets it)."""
    return os.sched_getscheduler(tid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


def _other_threads() -> list[int]:
    try:
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return []
    return [tid for tid in tids if tid != threading.get_native_id()]


def name(policy: int) -> str:
    for attr in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR"):
        if getattr(os, attr, None) == policy:
            return attr
    return f"policy {policy}"
