"""DynamicBatcher batching rules, on a gated fake executor and a manual clock."""

import numpy as np
import pytest

from aclserve.errors import InvalidInput, QueueFull, RequestTimeout
from aclserve.scheduling import QueuePolicy

pytestmark = pytest.mark.asyncio


def check(env, task, tag, rows):
    result = task.result()
    np.testing.assert_array_equal(result.outputs["y"], env.expected(tag, rows))
    return result


async def busy(env, batcher, executor, tag=99):
    """Occupy the single slot with a one-row run; returns (task, run)."""
    task = env.submit(batcher, tag)
    await env.settle()
    assert executor.runs[-1].tags == [tag]
    return task, executor.runs[-1]


async def test_lone_request_exactly_filling_a_gear_runs_at_once(env):
    batcher, executor = env.make()
    task = env.submit(batcher, 7)
    await env.settle()  # no clock advance: no batch window
    assert len(executor.runs) == 1 and executor.runs[0].gear == 1
    executor.runs[0].complete()
    await env.settle()
    result = check(env, task, 7, 1)
    assert (result.gear, result.batch_rows, result.batch_requests, result.queue_ns) == (1, 1, 1, 0)


async def test_request_that_fills_no_gear_waits_for_the_window_then_pads(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(2, 4)), max_queue_delay_ms=5)
    task = env.submit(batcher, 1, rows=3)
    await env.settle()
    env.clock.advance(0.0049)
    await env.settle()
    assert executor.runs == []
    env.clock.advance(0.0002)
    await env.settle()
    assert [run.gear for run in executor.runs] == [4]
    executor.runs[0].complete()
    await env.settle()
    result = check(env, task, 1, 3)  # 3 rows back: the padding row is dropped
    assert result.outputs["y"].shape == (3, 2) and result.gear == 4
    assert batcher.stats.padding_rows == 1 and batcher.stats.gear_batches == {4: 1}


async def test_arrivals_that_fill_a_gear_end_the_window_early(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(4,)), max_queue_delay_ms=100)
    tasks = [env.submit(batcher, tag) for tag in range(3)]
    await env.settle()
    assert executor.runs == []
    tasks.append(env.submit(batcher, 3))
    await env.settle()
    assert [run.tags for run in executor.runs] == [[0, 1, 2, 3]]


async def test_requests_accumulate_while_busy_and_leave_as_one_full_batch(env):
    batcher, executor = env.make()
    first, run = await busy(env, batcher, executor)
    tasks = [env.submit(batcher, tag) for tag in range(8)]
    await env.settle()
    env.clock.advance(1.0)  # windows long expired: still no one-by-one dispatch
    await env.settle()
    assert len(executor.runs) == 1
    run.complete()
    await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs[1:]] == [(8, list(range(8)))]
    executor.runs[1].complete()
    await env.settle()
    for tag, task in enumerate(tasks):
        assert check(env, task, tag, 1).batch_requests == 8


async def test_freed_slot_takes_what_accumulated_once_its_window_passed(env):
    batcher, executor = env.make(max_queue_delay_ms=2)
    first, run = await busy(env, batcher, executor)
    tasks = [env.submit(batcher, tag) for tag in range(5)]
    await env.settle()
    env.clock.advance(0.003)
    await env.settle()
    run.complete()
    await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs[1:]] == [(8, [0, 1, 2, 3, 4])]
    executor.runs[1].complete()
    await env.settle()
    for tag, task in enumerate(tasks):
        assert check(env, task, tag, 1).batch_requests == 5


async def test_two_free_slots_split_five_rows_into_four_plus_one_when_cheaper(env):
    executor = env.FakeExecutor(slots=2, gear_cost={1: 1.0, 2: 1.2, 4: 1.5, 8: 4.0})
    batcher, _ = env.make(executor, max_queue_delay_ms=2)
    a, run_a = await busy(env, batcher, executor, tag=90)
    b, run_b = await busy(env, batcher, executor, tag=91)
    tasks = [env.submit(batcher, tag) for tag in range(5)]
    await env.settle()
    env.clock.advance(0.003)
    run_a.complete()
    run_b.complete()  # both slots free before the batcher looks
    await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs[2:]] == [(4, [0, 1, 2, 3]), (1, [4])]
    for run in executor.runs[2:]:
        run.complete()
    await env.settle()
    for tag, task in enumerate(tasks):
        check(env, task, tag, 1)


async def test_priority_order_fifo_within_each_level_and_a_passed_over_level_every_third_run(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(1,)))
    first, run = await busy(env, batcher, executor)
    priorities = [3, 2, 1, 2, 1, 3, 0]
    tasks = [env.submit(batcher, tag, priority=p) for tag, p in enumerate(priorities)]
    await env.settle()
    run.complete()
    for _ in priorities:
        await env.settle()
        executor.runs[-1].complete()
    await env.settle()
    # priority order, FIFO within each level, except that one request a run (the gear 1) lets a
    # lower level waiting through two runs in a row take the third (composition.PASSED_OVER_RUNS):
    # levels 1 1 | 3 | 2 2 | 3 | 2 (tag 6 has priority 0: the default level, 2)
    assert [r.tags[0] for r in executor.runs[1:]] == [2, 4, 0, 1, 3, 5, 6]
    assert all(task.done() for task in tasks)


async def test_fifo_order_inside_a_batch_and_in_outputs(env):
    batcher, executor = env.make()
    first, run = await busy(env, batcher, executor)
    sizes = [3, 1, 2, 2]
    tasks = [env.submit(batcher, tag, rows=rows) for tag, rows in enumerate(sizes)]
    await env.settle()
    run.complete()
    await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs[1:]] == [(8, [0, 1, 2, 3])]
    executor.runs[1].complete()
    await env.settle()
    for tag, (task, rows) in enumerate(zip(tasks, sizes)):
        check(env, task, tag, rows)


async def test_full_level_is_rejected_at_once(env):
    batcher, executor = env.make(priority_queue_policy={2: QueuePolicy(max_queue_size=2)})
    first, run = await busy(env, batcher, executor)
    queued = [env.submit(batcher, tag) for tag in range(2)]
    await env.settle()
    with pytest.raises(QueueFull):
        await batcher.infer(env.make_rows(5, 1), 1)
    urgent = env.submit(batcher, 6, priority=1)
    await env.settle()
    assert batcher.queue_depth() == {1: 1, 2: 2, 3: 0}
    assert batcher.stats.levels[2].rejected == 1
    assert not any(task.done() for task in queued + [urgent])


async def test_timeout_rejects_at_the_deadline_while_a_long_batch_runs(env):
    batcher, executor = env.make(default_queue_policy=QueuePolicy(default_timeout_ms=50))
    first, run = await busy(env, batcher, executor)
    short = env.submit(batcher, 1, timeout_us=10_000)  # own timeout, shorter: applies
    long = env.submit(batcher, 2)  # the level default: 50 ms
    await env.settle()
    env.clock.advance(0.011)
    await env.settle()
    assert not run.done  # the executor is still blocked on the long batch
    with pytest.raises(RequestTimeout):
        short.result()
    assert not long.done()
    env.clock.advance(0.040)
    await env.settle()
    with pytest.raises(RequestTimeout):
        long.result()
    run.complete()
    await env.settle()
    assert len(executor.runs) == 1  # the timed-out requests never ran
    assert batcher.stats.levels[2].timed_out == 2


async def late_behind_a_busy_slot(env, **config):
    """On a delay level without a deadline, the only slot busy: `late` (its own timeout 1 ms) and
    `on_time` queued, and 2 ms pass. (batcher, executor, the busy run, late, on_time)."""
    policy = QueuePolicy(default_timeout_ms=0, timeout_action="delay")
    batcher, executor = env.make(env.FakeExecutor(gears=(1,)), default_queue_policy=policy, **config)
    _, run = await busy(env, batcher, executor)
    late = env.submit(batcher, 1, timeout_us=1000)
    on_time = env.submit(batcher, 2)
    await env.settle()
    env.clock.advance(0.002)
    await env.settle()
    return batcher, executor, run, late, on_time


async def test_delay_action_moves_a_late_request_behind_its_level(env):
    batcher, executor, run, late, on_time = await late_behind_a_busy_slot(env)
    assert not late.done()
    run.complete()
    await env.settle()
    executor.runs[-1].complete()
    await env.settle()
    executor.runs[-1].complete()
    await env.settle()
    assert [r.tags[0] for r in executor.runs[1:]] == [2, 1]
    check(env, late, 1, 1)
    check(env, on_time, 2, 1)
    assert batcher.stats.levels[2].delayed == 1


async def test_own_timeout_rejects_under_preserve_ordering_on_a_delay_level(env):
    """A delay level without a deadline of its own beside preserve_ordering (Triton loads the pair)
    moved a request whose own `timeout` passed behind the queue, where it held every later answer,
    already computed, until the on-time requests stopped coming (a tester's t17: 1.5 s). It is
    rejected at its deadline instead, and the request behind it is answered at once."""
    batcher, executor, run, late, on_time = await late_behind_a_busy_slot(env, preserve_ordering=True,
                                                                          priority_levels=1)
    with pytest.raises(RequestTimeout):
        late.result()
    run.complete()
    await env.settle()
    executor.runs[-1].complete()
    await env.settle()
    assert [r.tags for r in executor.runs] == [[99], [2]]
    check(env, on_time, 2, 1)  # nothing holds it: the late request left the queue
    assert (batcher.stats.levels[1].timed_out, batcher.stats.levels[1].delayed) == (1, 0)


async def test_cancelled_request_leaves_the_queue_at_once(env):
    policy = QueuePolicy(default_timeout_ms=100)
    batcher, executor = env.make(default_queue_policy=policy)
    first, run = await busy(env, batcher, executor)
    gone = env.submit(batcher, 1)
    stays = env.submit(batcher, 2)
    await env.settle()
    gone.cancel()
    await env.settle()
    assert batcher.queue_depth()[2] == 1 and env.clock.pending_timers == 1
    run.complete()
    await env.settle()
    assert [r.tags for r in executor.runs[1:]] == [[2]]
    assert batcher.stats.levels[2].cancelled == 1
    executor.runs[1].complete()
    await env.settle()
    check(env, stays, 2, 1)


async def test_cancelled_running_request_is_dropped_and_its_batch_mates_answered(env):
    batcher, executor = env.make()
    first, run = await busy(env, batcher, executor)
    tasks = [env.submit(batcher, tag) for tag in range(4)]
    await env.settle()
    run.complete()
    await env.settle()
    assert executor.runs[1].tags == [0, 1, 2, 3]
    tasks[1].cancel()
    await env.settle()
    executor.runs[1].complete()
    await env.settle()
    assert tasks[1].cancelled()
    for tag in (0, 2, 3):
        check(env, tasks[tag], tag, 1)
    # each request counted once: the cancelled one is not also a success (it ran all the same)
    level = batcher.stats.levels[2]
    assert level.cancelled == 1 and batcher.stats.success.count == 4 == level.accepted - level.cancelled


@pytest.mark.parametrize("config, rows, limit", [({}, 9, 8), ({"batch_cap": 4}, 5, 4)])
async def test_request_larger_than_the_maximum_batch_is_invalid(env, config, rows, limit):
    batcher, executor = env.make(**config)
    with pytest.raises(InvalidInput, match=f"batch of {rows} rows exceeds the model's maximum "
                                           f"batch size {limit}"):
        await batcher.infer(env.make_rows(1, rows), rows)
    assert executor.runs == []


async def test_disabled_batching_runs_one_request_per_run(env):
    batcher, executor = env.make(enabled=False)
    first, run = await busy(env, batcher, executor)
    tasks = [env.submit(batcher, tag, rows=rows) for tag, rows in enumerate([1, 3, 2])]
    await env.settle()
    for _ in range(4):
        executor.runs[-1].complete()
        await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs[1:]] == [(1, [0]), (4, [1]), (2, [2])]
    for tag, rows in enumerate([1, 3, 2]):
        check(env, tasks[tag], tag, rows)


async def test_static_model_runs_each_request_alone_with_no_gear(env):
    batcher, executor = env.make(env.FakeExecutor(gears=()))
    tasks = [env.submit(batcher, tag, rows=2) for tag in range(2)]
    await env.settle()
    executor.runs[0].complete()
    await env.settle()
    executor.runs[1].complete()
    await env.settle()
    assert [(r.gear, r.tags) for r in executor.runs] == [(None, [0]), (None, [1])]
    assert check(env, tasks[1], 1, 2).gear is None


async def test_after_the_window_rows_past_a_gear_wait_for_the_next_slot_instead_of_padding(env):
    # Cost proportional to rows (a compute-bound model): 6 queued rows run as 4 now; the other
    # 2 stay at the head of the queue and run when the slot is free again.
    gears = (1, 2, 4, 8)
    executor = env.FakeExecutor(gears=gears, gear_cost={g: 0.001 * g for g in gears})
    batcher, executor = env.make(executor, max_queue_delay_ms=5)
    tasks = [env.submit(batcher, tag) for tag in range(6)]
    await env.settle()
    env.clock.advance(0.006)
    await env.settle()
    assert [(run.gear, len(run.requests)) for run in executor.runs] == [(4, 4)]
    executor.runs[0].complete()
    await env.settle()
    assert [(run.gear, len(run.requests)) for run in executor.runs[1:]] == [(2, 2)]
    executor.runs[1].complete()
    await env.settle()
    for tag, task in enumerate(tasks):
        check(env, task, tag, 1)
    assert batcher.stats.padding_rows == 0
