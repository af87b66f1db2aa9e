"""Queue limits set to `auto`, resolved from the loaded model (after warm-up timed its gears).

Shedding by default: a bounded queue answers the excess 503 at once, so what is queued is
served soon instead of every client waiting longer and longer (and timing out, which wastes
the work done for it). The queue holds QUEUE_BATCHES full batches per instance (a full batch:
the batcher's limit, the largest gear or a lower max_batch_size; one row, on a model that runs
one request per run: a static one, batching off, a limit of one row, where a request of more
rows runs on a larger gear, costing about as many one-row runs);
the deadline is twice the longest wait a request should see (the batching window plus the time to run a
full queue at the measured speed), never under MIN_DEADLINE_MS, so it only fires when the
device falls far behind (a stall), not in an ordinary burst.

The auto size counts rows, not requests (QueuePolicy.counts_rows): counted in requests, a burst of
requests of a full batch each queued a full batch's times the runs the deadline is made for, and
waited it out for its 503 (a tester's 64 requests of 8 rows on a 200 ms run: 47 timed out after
3.2 s); in rows, the excess is refused at once. A size configured counts requests, as in Triton.
"""
from __future__ import annotations

import dataclasses
import math

from ..config import ModelConfig
from ..scheduling.gears import batch_limit, one_request_per_run
from ..scheduling.policy import QueuePolicy

QUEUE_BATCHES = 8
# A level holds at least this many rows: a pool of closed-loop clients (perf_analyzer's concurrency,
# a connection pool) of one row each cannot overload a queue longer than itself, and refusing it only
# makes it retry; with 16, 24 clients of one level on a model of one request per run were answered
# 503 by the tens of thousands (an independent check: 304 req/s against 698 without the refusals)
MIN_QUEUE = 64
MIN_DEADLINE_MS = 2000.0


def auto_queue_size(full_batch: int, instances: int) -> int:
    return max(MIN_QUEUE, QUEUE_BATCHES * max(1, full_batch) * instances)


def auto_deadline_ms(queue_size: int, full_batch: int, instances: int, gear_seconds: float | None,
                     window_ms: float = 0.0) -> float:
    runs = math.ceil(queue_size / (max(1, full_batch) * instances))
    return max(MIN_DEADLINE_MS, 2 * (window_ms + 1000.0 * (gear_seconds or 0.0) * runs))


def resolve(config: ModelConfig, gears, gear_cost: dict, instances: int) -> ModelConfig:
    """`config` with every `auto` (None) queue size and deadline replaced by its figure."""
    batching = config.batching
    gears = sorted(gears)
    # a full batch: the batch limit (a max_batch_size under the largest gear lowers it), run on
    # the smallest gear that holds it. One request per run: 1 row (the smallest gear; a static model's
    # run; the queue counts rows, so a request of many rows, run on a larger gear, counts as many),
    # with no window (with batching off, gears up to 32 counted as a full batch let a level hold 256
    # lone runs, 32 times the queued runs meant: an independent check)
    alone = one_request_per_run(gears, batching)
    full = 1 if alone else batch_limit(gears, batching)
    window_ms = 0.0 if alone else batching.max_queue_delay_ms
    cost = gear_cost.get(min((g for g in gears if g >= full), default=full)) if gear_cost else None

    def fill(policy: QueuePolicy) -> QueuePolicy:
        size, counts_rows = policy.max_queue_size, policy.counts_rows
        if size is None:
            size, counts_rows = auto_queue_size(full, instances), True
        deadline = policy.default_timeout_ms
        if deadline is None:
            deadline = auto_deadline_ms(size or auto_queue_size(full, instances), full, instances, cost, window_ms)
        return dataclasses.replace(policy, max_queue_size=size, default_timeout_ms=deadline, counts_rows=counts_rows)

    resolved = dataclasses.replace(
        batching, default_queue_policy=fill(batching.default_queue_policy),
        priority_queue_policy={level: fill(p) for level, p in batching.priority_queue_policy.items()})
    return dataclasses.replace(config, batching=resolved)
