"""Auto queue limits (overload.resolve): a model's queue size and deadline derived from its gears,
instances, run costs and batching settings, capped at the longest deadline one may write, and the
lines said about a long one."""
from __future__ import annotations

import dataclasses

from aclserve.config import ModelConfig
from aclserve.repository import overload
from aclserve.scheduling import QueuePolicy


def test_auto_queue_limits_follow_gears_instances_and_speed():
    config = overload.resolve(ModelConfig(), (1, 2, 4, 8), {8: 0.5}, instances=2)
    policy = config.batching.default_queue_policy
    assert policy.max_queue_size == 8 * 8 * 2 and policy.counts_rows  # rows: 8 full batches per instance
    assert policy.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)  # twice (window + 8 runs of a full queue)
    # a size configured counts requests, as in Triton; an auto deadline beside it is still derived
    configured = dataclasses.replace(ModelConfig().batching, default_queue_policy=QueuePolicy(
        max_queue_size=100, default_timeout_ms=None))
    given = overload.resolve(dataclasses.replace(ModelConfig(), batching=configured), (1, 2, 4, 8), {8: 0.5},
                             instances=2).batching.default_queue_policy
    assert (given.max_queue_size, given.counts_rows) == (100, False)
    assert given.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 50)  # each request a full batch: 100 runs on 2
    fast = overload.resolve(ModelConfig(), (1,), {1: 0.001}, instances=1).batching.default_queue_policy
    assert fast.max_queue_size == overload.MIN_QUEUE and fast.default_timeout_ms == overload.MIN_DEADLINE_MS


def test_an_auto_deadline_beside_a_size_in_requests_allows_for_a_full_batch_each(caplog):
    """A size configured counts requests, which may bring one row each or the batch limit's: the auto
    deadline was derived as if the size were rows (100 requests: 7 runs of 8 rows on 2 instances), so
    a level full of full batches, 50 runs, waited out a deadline made for 7 (on the heavy CNN, 48 of 64
    requests of 32 rows got 503 "timed out" after 2 s in the queue). Now it allows for a run a request,
    on the gear of the batch limit: with batching off too, where a request runs alone on the gear that
    holds it (not the smallest one's cost); and the INFO line says how to have a shorter one, a WARNING
    when it is over 60 s (max_queue_size 1000 at 150 ms a run: 300 s)."""
    def sized(size, **batching):
        return dataclasses.replace(ModelConfig(), batching=dataclasses.replace(
            ModelConfig().batching, default_queue_policy=QueuePolicy(max_queue_size=size, default_timeout_ms=None),
            **batching))

    gears = (1, 2, 4, 8, 16, 32)
    costs = {1: 0.05, 16: 0.3, 32: 0.5}
    on = overload.resolve(sized(64), gears, costs, instances=1).batching.default_queue_policy
    assert on.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 64)  # 64 runs of 32 rows, not 64 rows in 2 runs
    caplog.clear()  # the call above said its 64 s as a WARNING
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        overload.resolve(sized(64), gears, {1: 0.05, 16: 0.3, 32: 0.4}, instances=1, name="m:1")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", (
        "m:1: max_queue_size 64 counts requests, each of up to 32 rows: its auto default_timeout_ms, 51202, "
        "allows for 64 requests of 32 rows queued; set default_timeout_ms for a shorter deadline, or "
        "max_queue_size: auto to bound the rows"))]  # (it wrote "max_queue_size auto", the WARNINGs the YAML's words)
    caplog.clear()
    # the deadline grows with the size and the run cost (up to MAX_DEADLINE_MS): over 60 s it is a WARNING naming it
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        overload.resolve(sized(1000), gears, {32: 0.15}, instances=1, name="m:1")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", (
        "m:1: max_queue_size 1000 counts requests, each of up to 32 rows: its auto default_timeout_ms is 300002 "
        "(300 s, over 60 s), allowing for 1000 requests of 32 rows queued, so a stalled device is found only "
        "that late; set default_timeout_ms for a shorter deadline, or max_queue_size: auto to bound the rows"))]
    capped = overload.resolve(sized(64, batch_cap=16), gears, costs, instances=2).batching.default_queue_policy
    assert capped.default_timeout_ms == 2 * (1.0 + 1000 * 0.3 * 32)  # 16 rows each, on gear 16, 2 instances
    off = overload.resolve(sized(64, enabled=False), gears, costs, instances=1).batching.default_queue_policy
    assert off.default_timeout_ms == 2 * 1000 * 0.5 * 64  # alone on gear 32 each, no window (was gear 1's cost)
    static = overload.resolve(sized(64), (), {1: 0.05}, instances=1).batching.default_queue_policy
    assert static.default_timeout_ms == 2 * 1000 * 0.05 * 64  # its one run each, as before
    # the auto size counts rows: its deadline is the rows' (8 runs of 32), and an unbounded level's too
    auto = overload.resolve(ModelConfig(), gears, costs, instances=1).batching.default_queue_policy
    assert auto.counts_rows and auto.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)
    assert overload.resolve(sized(0), gears, costs, instances=1).batching.default_queue_policy.default_timeout_ms \
        == auto.default_timeout_ms


def test_an_auto_deadline_is_at_most_what_a_written_one_may_be(caplog):
    """Beside a size of 10**17 requests the deadline was 3.3e16 ms, whose microseconds /config could not
    show (500: tests/server/test_queue_rows.py); it is capped at the longest a written default_timeout_ms
    may be (24.8 days), and the WARNING says so. A window that long capped the rows' deadline too."""
    from aclserve.config.checks import MAX_MS
    size = 10**17
    huge = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(
        ModelConfig().batching, default_queue_policy=QueuePolicy(max_queue_size=size, default_timeout_ms=None)))
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        policy = overload.resolve(huge, (1, 32), {32: 0.15}, instances=1, name="m:1").batching.default_queue_policy
    assert policy.default_timeout_ms == overload.MAX_DEADLINE_MS == MAX_MS
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", (
        f"m:1: max_queue_size {size} counts requests, each of up to 32 rows: its auto default_timeout_ms is "
        "2147483647 (2147484 s), the longest a deadline may be, though 100000000000000000 requests of 32 rows "
        "queued take longer to run: a stalled device is found only that late, and a full queue's last requests may "
        "time out; set default_timeout_ms for a shorter deadline, or max_queue_size: auto to bound the rows"))]
    window = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching,
                                                                            max_queue_delay_ms=MAX_MS))
    assert overload.resolve(window, (1, 32), {32: 0.15}, instances=1).batching.default_queue_policy \
        .default_timeout_ms == MAX_MS


def test_auto_queue_limits_count_a_full_batch_of_a_lower_max_batch_size():
    def capped(rows):
        return dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching, batch_cap=rows))

    gears = (1, 2, 4, 8, 16, 32)
    policy = overload.resolve(capped(16), gears, {16: 0.5, 32: 1.0}, instances=1).batching.default_queue_policy
    assert policy.max_queue_size == 8 * 16  # not 8 x the largest gear, 32
    assert policy.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)  # 8 runs of gear 16's cost
    # a cap between gears runs on the next gear up, and costs that gear's run
    between = overload.resolve(capped(12), gears, {16: 0.5, 32: 1.0},
                               instances=1).batching.default_queue_policy
    assert between.max_queue_size == 8 * 12 and between.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)


def test_auto_queue_limits_count_one_request_a_full_batch_where_each_run_holds_one():
    """Batching off, a full batch is one request, not the largest gear (8 x 32 = 256 lone runs a
    level, an independent check saw); costed on the smallest gear, with no batching window. A
    static model's run is costed as its own (STATIC_RUN), as before, with no window either."""
    off = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching, enabled=False))
    gears, costs = (1, 2, 4, 8, 16, 32), {1: 0.05, 32: 0.5}
    policy = overload.resolve(off, gears, costs, instances=1).batching.default_queue_policy
    assert policy.max_queue_size == overload.MIN_QUEUE  # 8 x 1 x 1, raised to the floor for closed-loop clients
    assert policy.default_timeout_ms == 2 * 1000 * 0.05 * overload.MIN_QUEUE  # twice 64 runs of gear 1
    assert overload.resolve(off, gears, costs, instances=16).batching.default_queue_policy.max_queue_size == 8 * 16
    static = overload.resolve(ModelConfig(), (), {1: 0.05}, instances=1).batching.default_queue_policy
    assert (static.max_queue_size, static.default_timeout_ms) == (policy.max_queue_size, policy.default_timeout_ms)
    # batching on, the same gears still count the largest one
    on = overload.resolve(ModelConfig(), gears, costs, instances=1).batching.default_queue_policy
    assert on.max_queue_size == 8 * 32
