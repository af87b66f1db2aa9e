"""The execution timeout of a model's batches when the configuration leaves it to the pool
(execution_timeout_ms: 0): derived from the gears' warm-up costs."""
from __future__ import annotations

# Execution timeout when the configuration leaves it to the pool: this many times the largest
# gear's lone run (warm-up), at least the floor: a batch may wait behind the other slots'
# batches, and a busy host slows the CPU runtime by far more than a device varies.
TIMEOUT_RUNS = 100
TIMEOUT_FLOOR_MS = 2_000
# ... and at most this, below the device's default AI CPU op timeout (28-30 s, CANN's
# aclrtSetOpExecuteTimeOut page): on the A2/A3 series a model's AI CPU op that times out sets
# its stream's error without stopping the context, so the batch's events would report success
# and its answer be whatever the output buffers held; past this the batch has failed first.
# (A model whose largest gear runs longer than a third of it gets 3 runs.)
TIMEOUT_CEILING_MS = 25_000
# ... and until then (the warm-up that measures that run): nothing is known about the model yet.
UNMEASURED_TIMEOUT_MS = 60_000


def derived_timeout_ms(gear_cost: dict[int, float]) -> int:
    """The largest gear's warm-up cost (seconds per run, by gear) times TIMEOUT_RUNS, at least
    TIMEOUT_FLOOR_MS and at most TIMEOUT_CEILING_MS, or three runs if more."""
    largest_ms = max(gear_cost.values(), default=0.0) * 1000
    return max(round(3 * largest_ms), min(TIMEOUT_CEILING_MS, max(TIMEOUT_FLOOR_MS, round(largest_ms * TIMEOUT_RUNS))))
