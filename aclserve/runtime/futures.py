"""BatchFutures: one concurrent future per batch, for callers that form their own batches
(benchmarks, tests, embedding code) rather than going through the batcher or the Engine.

    futures = BatchFutures(pool)              # becomes the pool's listener
    batch = futures.submit([{"x": rows}], gear=4).result()
    batch.outputs[0]["y"], batch.timings.compute_ms
"""
from __future__ import annotations

import concurrent.futures
import threading

from .batch import Batch
from .pool import InstancePool


class BatchFutures:
    """The pool's BatchListener: resolves each batch's future from the completion thread."""

    def __init__(self, pool: InstancePool):
        self.pool = pool
        self.slots_freed = 0
        self._lock = threading.Lock()
        pool.attach(self)

    def submit(self, inputs, gear: int | None, lane: int | None = None) -> concurrent.futures.Future:
        """Run one batch of `inputs` (one mapping per request); the future resolves to the
        finished Batch or raises its error."""
        rows = sum(len(next(iter(r.values()))) for r in inputs) if gear is not None else 1
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pool.submit(Batch(inputs, gear, rows, lane, requests=(future,)))
        return future

    # -- BatchListener -------------------------------------------------------------------------
    def batch_done(self, batch: Batch) -> None:
        future = batch.requests[0]
        try:
            if batch.error is not None:
                future.set_exception(batch.error)
            else:
                future.set_result(batch)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled by the caller: nobody waits for this batch

    def slot_free(self) -> None:
        with self._lock:
            self.slots_freed += 1
