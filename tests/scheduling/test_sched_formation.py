"""Just-in-time batch formation, on a gated fake executor and a manual clock.

Gear g computes in g ms on the device and a lone run takes g + 0.4 ms from submit to result,
so the lead is 0.4 ms: a busy instance forms its next batch 0.4 ms before the predicted
result of the batch it runs (and up to formation.EARLY_S sooner, the timer tolerance).
"""
import pytest

from aclserve.scheduling.formation import EARLY_S

pytestmark = pytest.mark.asyncio

MS = 0.001
GEARS = (1, 2, 4, 8)
LEAD = 0.4 * MS
LOW, HIGH = 3, 1


def timed_executor(env, slots=2):
    return env.FakeExecutor(gears=GEARS, slots=slots,
                            compute_cost={g: g * MS for g in GEARS},
                            gear_cost={g: g * MS + LEAD for g in GEARS})


async def fill_gear_8(env, batcher, first_tag, priority=LOW):
    tasks = [env.submit(batcher, tag, priority=priority) for tag in range(first_tag, first_tag + 8)]
    await env.settle()
    return tasks


async def advance(env, seconds):
    env.clock.advance(seconds)
    await env.settle()


async def test_a_busy_instance_commits_nothing_until_its_moment_and_a_later_high_request_goes_first(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    running = await fill_gear_8(env, batcher, 0)  # idle instance: formed at once
    assert [(run.gear, len(run.requests)) for run in executor.runs] == [(8, 8)]
    # Predicted result of that run: now + 8.4 ms, so the next batch is due at now + 8.0 ms.
    waiting = await fill_gear_8(env, batcher, 100)  # a full gear, a free slot: still not formed
    await advance(env, 8 * MS - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 1
    urgent = env.submit(batcher, 999, priority=HIGH)
    await advance(env, 0.2 * MS)  # the moment has come
    assert len(executor.runs) == 2
    assert executor.runs[1].tags == [999] + list(range(100, 107))
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    executor.runs[1].complete(compute_ms=8)
    await env.settle()
    assert urgent.done() and not waiting[7].done()
    assert all(task.done() for task in running + waiting[:7])


async def test_when_slot_free_commits_at_once_and_the_high_request_waits_behind(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1,
                                 batch_formation="when_slot_free")
    await fill_gear_8(env, batcher, 0)
    waiting = await fill_gear_8(env, batcher, 100)
    assert [run.tags for run in executor.runs[1:]] == [list(range(100, 108))]  # committed now
    urgent = env.submit(batcher, 999, priority=HIGH)
    await advance(env, 5 * MS)
    assert len(executor.runs) == 2  # both slots taken: the high request waits for a third batch
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    assert executor.runs[2].tags == [999]
    executor.runs[1].complete(compute_ms=8)
    await env.settle()
    assert all(task.done() for task in waiting) and not urgent.done()


async def test_an_idle_instance_takes_a_lone_request_at_once(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=100)
    task = env.submit(batcher, 7)
    await env.settle()  # no clock advance
    assert [(run.gear, run.tags) for run in executor.runs] == [(1, [7])]
    executor.runs[0].complete(compute_ms=1)
    await env.settle()
    assert task.result().queue_ns == 0


async def test_at_most_one_batch_waits_behind_the_executing_one_even_with_free_slots(env):
    batcher, executor = env.make(timed_executor(env, slots=3), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await fill_gear_8(env, batcher, 200)
    await advance(env, 8 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100]
    await advance(env, 50 * MS)  # long after every prediction: still only one waiting
    assert len(executor.runs) == 2
    # The first result arrives late, at +58 ms: the waiting batch is re-anchored on it, so
    # the third is due 8 ms (its compute) - 0.4 ms (the lead) later, not at once.
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    assert len(executor.runs) == 2
    await advance(env, 8 * MS - LEAD - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 2
    await advance(env, 0.2 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100, 200]


async def test_reported_compute_times_move_the_moment(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await advance(env, 8 * MS)
    assert len(executor.runs) == 2
    await fill_gear_8(env, batcher, 200)
    executor.runs[0].complete(compute_ms=16)  # the device reports twice the warm-up figure
    await env.settle()
    # gear 8 now averages 8 + 0.2 * (16 - 8) = 9.6 ms: the third batch is due 9.2 ms on
    expected = 9.6 * MS - LEAD
    await advance(env, expected - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 2
    await advance(env, 0.2 * MS)
    assert len(executor.runs) == 3


async def test_a_busy_instance_takes_a_partial_batch_at_its_moment_without_a_window(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=100)
    await fill_gear_8(env, batcher, 0)
    partial = env.submit(batcher, 50, rows=3)  # fills no gear; an idle instance would wait 100 ms
    await advance(env, 8 * MS)
    assert [(run.gear, run.tags) for run in executor.runs[1:]] == [(4, [50])]
    executor.runs[0].complete(compute_ms=8)
    executor.runs[1].complete(compute_ms=4)
    await env.settle()
    assert partial.result().outputs["y"].shape == (3, 2)


async def test_with_one_slot_the_next_batch_waits_for_the_slot(env):
    batcher, executor = env.make(timed_executor(env, slots=1), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await advance(env, 20 * MS)
    assert len(executor.runs) == 1
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    assert [run.tags[0] for run in executor.runs] == [0, 100]
