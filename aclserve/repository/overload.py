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
3.2 s); in rows, the excess is refused at once. A size configured counts requests, as in Triton,
so the rows its full queue holds are not known when the model loads: anything from one row a request
to the batch limit's. Its auto deadline allows for the most, each request a run of its own on the gear
that holds the batch limit: derived from rows (as it was), a level of 64 requests of a full batch each
on a slow device waited out a deadline made for 2 runs and 48 of 64 got their 503 after 2 s of
queueing (the heavy CNN slowed to 150 ms a run). A deadline per request from the rows ahead of it
would cost a timer each (PriorityQueue keeps one a level); refusing the pair would fail every model
given only a size, the default's deadline being auto. The price: where clients send a row each, a
stall is found later (a batch limit's times); default_timeout_ms set, or max_queue_size auto, is the
tighter one. No cap under the time a full queue takes keeps that promise (it would time out requests
the queue accepted, the failure this figure is made to prevent); it is capped at MAX_MS only, the
longest a written default_timeout_ms may be, which /config shows in microseconds (Triton's uint64).
"""
from __future__ import annotations

import dataclasses
import logging
import math

from ..config import ModelConfig
from ..config.checks import MAX_MS
from ..scheduling.gears import batch_limit, one_request_per_run
from ..scheduling.policy import QueuePolicy

QUEUE_BATCHES = 8
# A level holds at least this many rows: a pool of closed-loop clients (perf_analyzer's concurrency,
# a connection pool) of one row each cannot overload a queue longer than itself, and refusing it only
# makes it retry; with 16, 24 clients of one level on a model of one request per run were answered
# 503 by the tens of thousands (an independent check: 304 req/s against 698 without the refusals)
MIN_QUEUE = 64
MIN_DEADLINE_MS = 2000.0
# a deadline derived beside a size in requests grows with the size and the run cost, bounded only by
# MAX_DEADLINE_MS (it is made so that a burst the queue accepted is never timed out: a lower cap would time
# out what the queue took, the failure it prevents); past this it is said as a WARNING: a stall
# is found only that late (max_queue_size 1000 of 32-row requests at 150 ms a run: 5 minutes)
LONG_DEADLINE_MS = 60_000.0
# the most a derived deadline is (any, rows' too: a window of MAX_MS made it twice that): the longest a written
# one may be, 24.8 days. Uncapped, a size of 10**17 requests made it 3.3e16 ms, whose microseconds /config
# could not show (HTTP 500, gRPC INTERNAL: Triton's default_timeout_microseconds is a uint64)
MAX_DEADLINE_MS = float(MAX_MS)

log = logging.getLogger(__name__)


def auto_queue_size(full_batch: int, instances: int) -> int:
    return max(MIN_QUEUE, QUEUE_BATCHES * max(1, full_batch) * instances)


def auto_deadline_ms(queue_size: int, full_batch: int, instances: int, gear_seconds: float | None,
                     window_ms: float = 0.0) -> float:
    runs = math.ceil(queue_size / (max(1, full_batch) * instances))
    return min(MAX_DEADLINE_MS, max(MIN_DEADLINE_MS, 2 * (window_ms + 1000.0 * (gear_seconds or 0.0) * runs)))


def resolve(config: ModelConfig, gears, gear_cost: dict, instances: int, name: str = "model") -> ModelConfig:
    """`config` with every `auto` (None) queue size and deadline replaced by its figure. A deadline
    derived beside a size in requests is said in one line (`name`: the model's), once a size: INFO, or
    WARNING when it is over LONG_DEADLINE_MS (saying so when MAX_DEADLINE_MS capped it)."""
    batching = config.batching
    gears = sorted(gears)
    # a full batch: the batch limit (a max_batch_size under the largest gear lowers it), run on
    # the smallest gear that holds it. One request per run: 1 row (the smallest gear; a static model's
    # run; the queue counts rows, so a request of many rows, run on a larger gear, counts as many),
    # with no window (with batching off, gears up to 32 counted as a full batch let a level hold 256
    # lone runs, 32 times the queued runs meant: an independent check)
    alone = one_request_per_run(gears, batching)
    limit = batch_limit(gears, batching)
    full = 1 if alone else limit
    window_ms = 0.0 if alone else batching.max_queue_delay_ms
    cost = _cost_of(full, gears, gear_cost)
    # a size in requests: each may bring the batch limit's rows (a static model: its one run), a run each
    largest = limit or 1
    largest_cost = _cost_of(largest, gears, gear_cost)
    per_requests: dict[int, float] = {}  # size in requests -> the deadline derived for it

    def fill(policy: QueuePolicy) -> QueuePolicy:
        size, counts_rows = policy.max_queue_size, policy.counts_rows
        if size is None:
            size, counts_rows = auto_queue_size(full, instances), True
        deadline = policy.default_timeout_ms
        if deadline is None and size and not counts_rows:
            deadline = per_requests[size] = auto_deadline_ms(size * largest, largest, instances, largest_cost,
                                                             window_ms)
        elif deadline is None:  # rows (an unbounded level: the auto size's)
            deadline = auto_deadline_ms(size or auto_queue_size(full, instances), full, instances, cost, window_ms)
        return dataclasses.replace(policy, max_queue_size=size, default_timeout_ms=deadline, counts_rows=counts_rows)

    resolved = dataclasses.replace(
        batching, default_queue_policy=fill(batching.default_queue_policy),
        priority_queue_policy={level: fill(p) for level, p in batching.priority_queue_policy.items()})
    for size, deadline in sorted(per_requests.items()):
        _say_deadline_for_requests(name, size, largest, deadline)
    return dataclasses.replace(config, batching=resolved)


def _say_deadline_for_requests(name: str, size: int, rows: int, deadline: float) -> None:
    """The one line for a deadline derived beside a size in requests (`rows`: the most a request brings):
    INFO, or WARNING when it is over LONG_DEADLINE_MS (saying so when MAX_DEADLINE_MS capped it)."""
    queued = f"{size} requests of {rows} rows queued"
    if deadline >= MAX_DEADLINE_MS:
        level, figure = logging.WARNING, (f" is {deadline:.0f} ({deadline / 1000.0:.0f} s), the longest a deadline "
                                          f"may be, though {queued} take longer to run: a stalled device is found only "
                                          "that late, and a full queue's last requests may time out")
    elif deadline > LONG_DEADLINE_MS:
        level, figure = logging.WARNING, (f" is {deadline:.0f} ({deadline / 1000.0:.0f} s, over "
                                          f"{LONG_DEADLINE_MS / 1000.0:.0f} s), allowing for {queued}, so a stalled "
                                          "device is found only that late")
    else:
        level, figure = logging.INFO, f", {deadline:.0f}, allows for {queued}"
    log.log(level, "%s: max_queue_size %d counts requests, each of up to %d rows: its auto default_timeout_ms%s; set "
            "default_timeout_ms for a shorter deadline, or max_queue_size: auto to bound the rows", name, size, rows,
            figure)


def _cost_of(rows: int, gears, gear_cost: dict) -> float | None:
    """The measured seconds of a run of `rows` rows: the smallest gear holding them (a static model's
    run under its key, 1)."""
    return gear_cost.get(min((g for g in gears if g >= rows), default=rows)) if gear_cost else None
