"""Just-in-time batch formation, on a gated fake executor and a manual clock.

Gear g computes in g ms on the device and a lone run takes g + 0.4 ms from submit to result,
so the lead is 0.4 ms: a busy instance forms its next batch 0.4 ms before the predicted
result of the batch it runs. Its timer is armed for that moment; a wake-up up to
formation.EARLY_S before it (uvloop rounds timers to whole milliseconds) counts as the moment,
so each test checks "not yet" just before that tolerance and "done" just after the moment.
"""
from types import SimpleNamespace

import pytest

from aclserve.scheduling.formation import EARLY_S, Formation, GearTimes

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
    await env.settle()
    assert len(executor.runs) == 1  # queued, before the moment
    await advance(env, EARLY_S + 0.2 * MS)  # the moment has come
    assert [(run.gear, run.tags) for run in executor.runs[1:]] == [(8, [999] + list(range(100, 107)))]
    executor.runs[0].complete(compute_ms=8)
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
    await env.settle()  # queued now (alone while arrivals overlap: it may wait its 1 ms window)
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
    await advance(env, EARLY_S + 0.2 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100, 200]


async def test_the_median_of_reported_compute_times_moves_the_moment_one_slow_run_does_not(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await advance(env, 8 * MS)
    assert len(executor.runs) == 2
    await fill_gear_8(env, batcher, 200)
    await advance(env, 1 * MS)
    executor.runs[0].complete(compute_ms=16)  # one run reports twice the warm-up figure
    await env.settle()
    # gear 8 still predicts 8 ms (the lower median of 8 and 16): the third batch is due in 7.6
    await advance(env, 8 * MS - LEAD - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 2
    await advance(env, EARLY_S + 0.2 * MS)
    assert len(executor.runs) == 3
    await fill_gear_8(env, batcher, 300)
    executor.runs[1].complete(compute_ms=16)  # a second one: the median of 8, 16, 16 is 16
    await env.settle()
    await advance(env, 16 * MS - LEAD - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 3
    await advance(env, EARLY_S + 0.2 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100, 200, 300]


async def test_a_partial_batch_waits_for_the_later_of_its_window_and_the_moment(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=5)
    await fill_gear_8(env, batcher, 0)
    early = env.submit(batcher, 50, rows=3)  # fills no gear; its window ends at +5 ms
    await env.settle()
    await advance(env, 8 * MS + EARLY_S + 0.1 * MS)  # the moment, long after that window
    assert [(run.gear, run.tags) for run in executor.runs[1:]] == [(4, [50])]
    executor.runs[0].complete(compute_ms=8)  # the next batch is due 4 - 0.4 ms from now
    await env.settle()
    late = env.submit(batcher, 60, rows=3)  # its window ends 5 ms from now, after that moment
    await env.settle()
    await advance(env, 4 * MS + EARLY_S)
    assert len(executor.runs) == 2
    await advance(env, 1 * MS)
    assert [(run.gear, run.tags) for run in executor.runs[2:]] == [(4, [60])]
    executor.runs[1].complete(compute_ms=4)
    executor.runs[2].complete(compute_ms=4)
    await env.settle()
    assert early.result().outputs["y"].shape == late.result().outputs["y"].shape == (3, 2)


async def test_with_one_slot_the_next_batch_waits_for_the_slot(env):
    batcher, executor = env.make(timed_executor(env, slots=1), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await advance(env, 20 * MS)
    assert len(executor.runs) == 1
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    assert [run.tags[0] for run in executor.runs] == [0, 100]


async def test_a_result_that_finds_nothing_formed_while_requests_wait_lengthens_the_lead(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)  # predicted result at +8.4 ms, next batch due at +8.0 ms
    await fill_gear_8(env, batcher, 100)
    await advance(env, 5 * MS)
    executor.runs[0].complete(compute_ms=8)  # 3.4 ms earlier than predicted: a miss
    await env.settle()
    assert [run.tags[0] for run in executor.runs] == [0, 100]  # the idle instance takes it at once
    await fill_gear_8(env, batcher, 200)
    # The lead grew by those 3.4 ms to 3.8 ms: the third batch is due 8.4 - 3.8 = 4.6 ms after
    # the second was booked (with the warm-up lead it would have been 8.0 ms).
    await advance(env, 4.6 * MS - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 2
    await advance(env, EARLY_S + 0.2 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100, 200]


async def test_lower_levels_only_fill_the_padding_of_a_higher_levels_batch(env):
    batcher, executor = env.make(timed_executor(env, slots=1), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    low = [env.submit(batcher, tag, priority=LOW) for tag in range(100, 105)]
    high = [env.submit(batcher, tag, priority=HIGH) for tag in range(900, 903)]
    await env.settle()
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    # 3 high rows run on gear 4 with one low row in the padding, not on gear 8 with all five
    assert [(run.gear, run.tags) for run in executor.runs[1:]] == [(4, [900, 901, 902, 100])]
    executor.runs[1].complete(compute_ms=4)
    await env.settle()
    assert [(run.gear, run.tags) for run in executor.runs[2:]] == [(4, [101, 102, 103, 104])]
    executor.runs[2].complete(compute_ms=4)
    await env.settle()
    assert all(task.done() for task in low + high)


@pytest.mark.parametrize("formation, gear_cost", [
    ("just_in_time", {1: 2.0 * MS, 2: 2.0 * MS, 4: 4.0 * MS, 8: 4.2 * MS}),  # gear 8 nearly free
    ("when_slot_free", None),  # the rule before: batches always fill up
])
async def test_lower_levels_fill_a_higher_levels_batch_when_that_is_nearly_free_or_under_the_old_rule(
        env, formation, gear_cost):
    executor = timed_executor(env, slots=1)
    if gear_cost:
        executor.gear_cost = gear_cost
    batcher, executor = env.make(executor, max_queue_delay_ms=1, batch_formation=formation)
    await fill_gear_8(env, batcher, 0)
    for tag in range(100, 105):
        env.submit(batcher, tag, priority=LOW)
    for tag in range(900, 903):
        env.submit(batcher, tag, priority=HIGH)
    await env.settle()
    executor.runs[0].complete(compute_ms=8)
    await env.settle()
    assert [(run.gear, run.tags) for run in executor.runs[1:]] == [(8, [900, 901, 902, 100, 101, 102, 103, 104])]
    executor.runs[1].complete(compute_ms=8)
    await env.settle()


async def test_idle_instances_take_batches_first_then_each_busy_one_at_its_own_moment(env):
    executor = env.FakeExecutor(gears=GEARS, slots=2, instances=2, compute_cost={g: g * MS for g in GEARS},
                                gear_cost={g: g * MS + LEAD for g in GEARS})
    batcher, executor = env.make(executor, max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await advance(env, 2 * MS)
    await fill_gear_8(env, batcher, 100)  # the second instance is idle: it takes this at once
    for first in (200, 300, 400):
        await fill_gear_8(env, batcher, first)
    assert [(run.lane, run.tags[0]) for run in executor.runs] == [(0, 0), (1, 100)]
    await advance(env, 6 * MS + EARLY_S + 0.1 * MS)  # instance 0's moment: +8.0 ms
    assert [(run.lane, run.tags[0]) for run in executor.runs[2:]] == [(0, 200)]
    await advance(env, 2 * MS)  # instance 1's moment, 2 ms later
    assert [(run.lane, run.tags[0]) for run in executor.runs[2:]] == [(0, 200), (1, 300)]
    await advance(env, 50 * MS)  # each has one batch waiting: the rest waits for a result
    assert len(executor.runs) == 4
    executor.runs[1].complete(compute_ms=8)
    await env.settle()
    await advance(env, 8 * MS)
    assert [(run.lane, run.tags[0]) for run in executor.runs[4:]] == [(1, 400)]


async def test_a_batch_coming_back_late_behind_another_lengthens_the_lead_by_half_the_idle_time(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    for first in (0, 100, 200):
        await fill_gear_8(env, batcher, first)
    await advance(env, 8.4 * MS)  # the second batch was formed at +8.0 ms
    executor.runs[0].complete(compute_ms=8)  # on time: the second is due back at +16.4 ms
    await env.settle()
    await advance(env, 7.6 * MS)  # +16.0 ms: the third batch is formed behind the second
    assert len(executor.runs) == 3
    await fill_gear_8(env, batcher, 300)
    await advance(env, 3.4 * MS)
    # The second batch computed 8 ms but comes back 11 ms after the first: the compute stream
    # sat idle 3 ms, 2 ms beyond the tolerance, so the lead grows by 1 ms to 1.4 ms and the
    # fourth batch is due 8 - 1.4 ms from now (8 - 0.4 ms with the warm-up lead).
    executor.runs[1].complete(compute_ms=8)
    await env.settle()
    await advance(env, 6.6 * MS - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 3
    await advance(env, EARLY_S + 0.2 * MS)
    assert [run.tags[0] for run in executor.runs] == [0, 100, 200, 300]


async def test_the_lead_never_exceeds_half_the_longest_compute(env):
    batcher, executor = env.make(timed_executor(env), max_queue_delay_ms=1)
    await fill_gear_8(env, batcher, 0)
    await fill_gear_8(env, batcher, 100)
    await advance(env, 1 * MS)
    executor.runs[0].complete(compute_ms=8)  # 7.4 ms early: the lead would grow to 7.8 ms
    await env.settle()
    await fill_gear_8(env, batcher, 200)
    # ... but stops at 4 ms: the third batch is due 8.4 - 4 ms after the second was booked
    await advance(env, 4.4 * MS - EARLY_S - 0.1 * MS)
    assert len(executor.runs) == 2
    await advance(env, EARLY_S + 0.2 * MS)
    assert len(executor.runs) == 3


async def test_a_miss_never_takes_the_lead_below_its_warm_up_figure():
    """The ceiling, half the longest gear's compute, was below the warm-up lead on a light model
    whose host time is most of a run (digits: 0.2 ms of host time, 0.04 ms of compute), so a miss
    set the lead to that ceiling, a tenth of the warm-up figure, and batches were formed too late
    until the next on-time result put it back (a reviewer)."""
    times = GearTimes((1, 8), {1: 0.24e-3, 8: 0.25e-3}, {1: 0.03e-3, 8: 0.04e-3})
    formation = Formation(times)
    assert times.lead == pytest.approx(0.21e-3)
    formation.choose([2], now=0.0)
    run = SimpleNamespace(gear=8)
    formation.booked(0, run, now=0.0)
    formation.finished(0, run, now=0.1e-3, compute_s=0.04e-3, waiting=True)  # nothing formed: a miss
    assert formation.lead >= times.lead
