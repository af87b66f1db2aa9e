"""BatchFutures: one concurrent future per batch, for callers that form their own batches
(benchmarks, tests, embedding code) rather than going through the batcher or the Engine.

    futures = BatchFutures(pool)              # becomes the pool's listener
    batch = futures.submit([{"x": rows}], gear=4).result()
    batch.outputs[0]["y"], batch.timings.compute_ms
"""
from __future__ import annotations

import concurrent.futures

from .batch import Batch
from .pool import InstancePool


def settle(future: concurrent.futures.Future, error: BaseException | None, result=None) -> None:
    """Resolve `future` from an executor thread, unless its caller has cancelled it (e.g.
    asyncio.wait_for around asyncio.wrap_future): nobody waits for the answer then."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


class BatchFutures:
    """The pool's BatchListener: resolves each batch's future from the completion thread."""

    def __init__(self, pool: InstancePool):
        self.pool = pool
        pool.attach(self)

    def submit(self, inputs, gear: int | None, lane: int | None = None) -> concurrent.futures.Future:
        """Run one batch of `inputs` (one mapping per request); the future resolves to the
        finished Batch or raises its error (a batch re-run one request per run after failing
        comes back with each request's own error in `errors` when only some failed:
        isolation.py)."""
        rows = sum(len(next(iter(r.values()))) for r in inputs) if gear is not None else 1
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pool.submit(Batch(inputs, gear, rows, lane, requests=(future,)))
        return future

    # -- BatchListener -------------------------------------------------------------------------
    def batch_done(self, batch: Batch) -> None:
        settle(batch.requests[0], batch.error, batch)

    def slot_free(self) -> None:
        pass  # every batch was handed to the pool at submit(); nothing waits here
