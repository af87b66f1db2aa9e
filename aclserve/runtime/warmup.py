"""A pool's warm-up: every gear run a few times on zeros (or ones: a model's `warmup_data`) before
the pool serves, which times what the batcher plans with (`InstancePool.gear_cost`, and
`compute_cost` from the device's events)."""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from ..acl.check import model_refused
from ..errors import DeviceTimeout
from .batch import Batch

WARMUP_DATA = ("zeros", "ones")  # what the warm-up can run every gear on
# The key of a static model's run in gear_cost (one request a run, as the queue limits count it):
# without it the execution timeout and the queue deadline took their 2 s floors, and a static
# model running longer failed every request (found by a review)
STATIC_RUN = 1


def warm_up(pool, runs: int = 3, stop: Callable[[], bool] | None = None,
            progress: Callable[[int | None, int, int], None] | None = None, data: str = "zeros",
            remedy: str = "", timeout_remedy: str = "") -> dict[int, float]:
    """Run every gear of `pool` (an unattached InstancePool) `runs` times on `data`, zeros or
    ones (blocking).
    The cost of a gear is the quickest submit-to-result time of the runs after the first: what
    the batcher trades padding against, including the fixed host cost of a run, not only the
    device's. The quickest device compute time of those runs goes to `compute_cost` (when the
    device reports it). `stop()` true before a run ends the warm-up there, its figures
    incomplete (a load abandoned at shutdown: nobody will use them); `progress(gear, run, runs)`
    hears each run begin (gear None for a model without gears); `remedy` ends the message of a
    run that failed on zeros (what the caller offers a model that cannot run on them; not for a
    run GE refused whatever its data, acl.check.model_refused: its message says the data), and
    `timeout_remedy` that of a run past the execution timeout (the data is not to blame: what
    the caller offers to wait longer), after the time of the slowest run that finished, if one
    did. A static model's one run is costed under STATIC_RUN. Returns the gear costs."""
    fill = np.ones if data == "ones" else np.zeros
    slowest = 0.0  # seconds: the longest run that finished, which a timeout's message gives
    for gear in pool.gears or (None,):
        rows = gear or 1
        request = {s.name: fill((rows,) + s.sample_shape if s.batched else s.shape, s.dtype) for s in pool.inputs}
        best = compute = float("inf")
        for run in range(runs):
            if stop is not None and stop():
                return dict(pool.gear_cost)
            if progress is not None:
                progress(gear, run, runs)
            start = time.perf_counter()
            batch = _run_alone(pool, Batch([request], gear, rows))
            if batch.error is not None:
                batch.error.warm_up_run = (gear, run)  # (the same run failing alike again: repository/retry.py)
                if isinstance(batch.error, DeviceTimeout):
                    took = f" (the slowest warm-up run that finished took {slowest * 1000:.0f} ms)" if slowest else ""
                    raise _in_warm_up(batch.error, data, took + timeout_remedy)
                if model_refused(batch.error):  # (the model's own failure: the data is not to blame)
                    raise _in_warm_up(batch.error, None, "")
                raise _in_warm_up(batch.error, data, remedy if data == "zeros" else "")
            took = time.perf_counter() - start
            slowest = max(slowest, took)
            if run:
                best = min(best, took)
                if batch.timings.compute_ms > 0:
                    compute = min(compute, batch.timings.compute_ms / 1000.0)
        key = STATIC_RUN if gear is None else gear
        pool.gear_cost[key] = best if best < float("inf") else 1e-6
        if compute < float("inf"):
            pool.compute_cost[key] = compute
    for instance in pool.instances:  # (the warm-up's runs read as utilisation: a fresh version half busy)
        instance.restart_busy()
    return dict(pool.gear_cost)


def _run_alone(pool, batch: Batch) -> Batch:
    """Run one batch and wait for it (blocking), before the pool has its owner (whose listener
    would otherwise get this batch: attach refuses a second one)."""
    waiter = _Waiter()
    pool.attach(waiter)
    pool.submit(batch)
    waiter.done.wait()  # (interrupted, Ctrl-C: the waiter stays to hear the batch end)
    pool.attach(None)
    return batch


class _Waiter:
    """The listener of a blocking run: wakes the waiting thread when its batch is done."""

    def __init__(self):
        self.done = threading.Event()

    def batch_done(self, batch: Batch) -> None:
        self.done.set()

    def slot_free(self) -> None:
        pass


def _in_warm_up(error: BaseException, data: str | None, remedy: str) -> BaseException:
    """The error, its message saying it came of the warm-up's data (a model that fails on zeros,
    an integer division say, never serves: the reason says why and what to set; None: a run that
    fails whatever its data), its type and cause kept (they decide whether the load is retried)."""
    message = getattr(error, "message", None)
    if isinstance(message, str):
        error.message = f"the warm-up run{f' on {data}' if data else ''} failed: {message}{remedy}"
        error.args = (error.message,)
    return error
