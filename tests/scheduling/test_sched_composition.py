"""Composer under just-in-time formation: what priority lets a batch commit the device to
(a real PriorityQueue and GearPlanner, a manual clock, no event loop)."""
import pytest

from aclserve.scheduling import BatchingConfig, GearPlanner, PriorityQueue, QueuedRequest
from aclserve.scheduling.composition import ACTIVE_S, PASSED_OVER_COSTS, Composer

GEARS = (1, 2, 4, 8, 16, 32)
FLAT = {g: 0.0024 * g for g in GEARS}  # a CPU-like device: every gear costs the same per row
HIGH, LOW = 1, 3


def setup(clock, costs=FLAT):
    queue = PriorityQueue(BatchingConfig(), clock, lambda r: None)
    planner = GearPlanner(GEARS, costs, 32)
    composer = Composer(GEARS, planner, 32, batching=True, delay_s=0.0, just_in_time=True)
    return queue, composer


def push(queue, clock, count, priority):
    for _ in range(count):
        queue.push(QueuedRequest({}, 1, queue.level_for(priority), clock.now(), None))


def levels(batch):
    return [r.level for r in batch]


def test_lower_levels_run_on_a_short_gear_while_a_higher_level_is_active(clock):
    """Formed when the instance falls idle, just before the high clients send again: 20 low
    rows would run as 16 (39 ms here) and the highs arriving next would wait for all of it."""
    queue, composer = setup(clock)
    push(queue, clock, 20, LOW)
    batch, _ = composer.next_batch(queue, clock.now())
    assert len(batch) == 16  # no higher level seen yet: the cheapest split, as before
    push(queue, clock, 3, HIGH)
    batch, _ = composer.next_batch(queue, clock.now())
    assert levels(batch) == [HIGH] * 3 + [LOW]  # lows only in the highs' padding (gear 4)
    batch, _ = composer.next_batch(queue, clock.now())
    assert levels(batch) == [LOW]  # the highs were just served: the smallest efficient gear
    clock.advance(ACTIVE_S + 0.01)
    batch, _ = composer.next_batch(queue, clock.now())
    assert len(batch) == 2  # the highs went quiet: the rest of the lows, whole


def test_no_short_gear_where_small_batches_cost_more_per_row(clock):
    fixed_overhead = {g: 0.002 + 0.0001 * g for g in GEARS}  # like the light MLP: the run, not the rows
    queue, composer = setup(clock, fixed_overhead)
    push(queue, clock, 1, HIGH)
    composer.next_batch(queue, clock.now())
    push(queue, clock, 32, LOW)
    batch, _ = composer.next_batch(queue, clock.now())
    assert len(batch) == 32


def test_lower_levels_left_out_of_every_batch_join_one_in_time(clock):
    """Three high clients keeping the device busy with batches of one and two rows (their
    requests staggered) took no low row at all: lows starved until their deadlines."""
    queue, composer = setup(clock)
    push(queue, clock, 24, LOW)
    bound = PASSED_OVER_COSTS * FLAT[16]  # the 25 rows queued would run as 16 (take_limit)
    started, batches = clock.now(), []
    while not batches or batches[-1] == [HIGH]:
        assert len(batches) < 1000  # a hang guard
        push(queue, clock, 1, HIGH)
        batch, _ = composer.next_batch(queue, clock.now())
        batches.append(levels(batch))
        clock.advance(FLAT[1])
    joined_after = clock.now() - FLAT[1] - started
    # the first low goes first, then the high, then the other lows as they fit (16 rows in all)
    assert len(batches) > 2 and batches[-1][:2] == [LOW, HIGH] and batches[-1].count(LOW) == 15
    assert bound < joined_after <= bound + 2 * FLAT[1]


def test_one_request_per_run_lower_levels_get_a_run_after_being_passed_over(clock):
    """A static model (or batching off) ran the highest level's head every time: three high
    clients keeping the device busy starved 24 low ones until their deadlines (found by an
    independent check). Now lower levels get every (PASSED_OVER_RUNS + 1)-th run while they
    wait (the highest of them first), and the highs the rest, in order."""
    from aclserve.scheduling.composition import PASSED_OVER_RUNS
    queue = PriorityQueue(BatchingConfig(), clock, lambda r: None)
    composer = Composer((), None, 1, batching=False, delay_s=0.0, just_in_time=True)
    push(queue, clock, 1, 2)
    clock.advance(0.001)
    push(queue, clock, 1, LOW)  # a level lower still, but it came later
    clock.advance(0.001)
    first_lower = next(r for r in queue if r.level == 2)
    runs = []
    for _ in range(2 * (PASSED_OVER_RUNS + 1)):
        push(queue, clock, 1, HIGH)  # a high client sends again as soon as it is answered
        batch, _ = composer.next_batch(queue, clock.now())
        runs.append(batch)
    assert [levels(b) for b in runs] == ([[HIGH]] * PASSED_OVER_RUNS + [[2]] + [[HIGH]] * PASSED_OVER_RUNS + [[LOW]])
    assert runs[PASSED_OVER_RUNS] == [first_lower]
    push(queue, clock, 2, HIGH)  # nothing lower waits (two highs were left): the highs, with no count kept
    assert [levels(composer.next_batch(queue, clock.now())[0]) for _ in range(4)] == [[HIGH]] * 4
    assert len(queue) == 0


def test_a_batch_limit_of_one_row_runs_one_request_per_run_with_the_same_guard(clock):
    """Gears up to 8 and max_batch_size 1 (or the gear 1 alone): every batch of one high row is
    full, so the batched guard never saw the lows passed over: 30 runs, 30 highs (a review)."""
    from aclserve.scheduling.composition import PASSED_OVER_RUNS
    queue = PriorityQueue(BatchingConfig(), clock, lambda r: None)
    composer = Composer((1, 2, 4, 8), GearPlanner((1, 2, 4, 8), FLAT, 1), 1, batching=True, delay_s=0.0,
                        just_in_time=True)
    push(queue, clock, 3, LOW)
    runs = []
    for _ in range(3 * (PASSED_OVER_RUNS + 1)):
        push(queue, clock, 1, HIGH)
        runs.append(levels(composer.next_batch(queue, clock.now())[0]))
    assert runs.count([LOW]) == 3 and runs.count([HIGH]) == 3 * PASSED_OVER_RUNS


def test_a_lower_level_serves_its_requests_within_their_deadline_before_its_delayed_ones(clock):
    """The lower level's oldest request, delayed past its deadline (timeout_action: delay), went
    ahead of one of its level still within its deadline (a review): each level's own order is kept."""
    from aclserve.scheduling import QueuePolicy
    from aclserve.scheduling.composition import PASSED_OVER_RUNS
    config = BatchingConfig(priority_queue_policy={LOW: QueuePolicy(default_timeout_ms=10, timeout_action="delay")})
    queue = PriorityQueue(config, clock, lambda r: None)
    composer = Composer((), None, 1, batching=False, delay_s=0.0, just_in_time=True)
    push(queue, clock, 1, LOW)
    delayed = next(iter(queue))
    clock.advance(0.02)  # its deadline passes: delayed
    push(queue, clock, 1, LOW)
    on_time = next(r for r in queue if r is not delayed)
    assert delayed.delayed and not on_time.delayed
    lows = []
    for _ in range(2 * (PASSED_OVER_RUNS + 1)):
        push(queue, clock, 1, HIGH)
        lows += [r for r in composer.next_batch(queue, clock.now())[0] if r.level == LOW]
    assert lows == [on_time, delayed]


def test_lower_levels_get_in_where_higher_ones_fill_every_batch_alone(clock):
    """Two high clients sending full batches (32 rows each, one running, one queued): the
    batched guard saw nothing passed over, since each batch held only high rows, and a low
    request waited for good (a review). Past the same bound it now goes first in a batch."""
    queue, composer = setup(clock)
    push(queue, clock, 1, LOW)
    bound = PASSED_OVER_COSTS * FLAT[32]
    started, batches = clock.now(), []
    while not batches or LOW not in batches[-1]:
        assert len(batches) < 100  # a hang guard
        queue.push(QueuedRequest({}, 32, queue.level_for(HIGH), clock.now(), None))
        batch, _ = composer.next_batch(queue, clock.now())
        batches.append(levels(batch))
        clock.advance(FLAT[32])
    assert batches[-1][0] == LOW and sum(1 for level in batches[-1] if level == HIGH) == 0  # 32 rows: no room
    assert len(batches) > 2 and bound < clock.now() - FLAT[32] - started <= bound + 2 * FLAT[32]
    assert queue.top_level() == HIGH  # the high request it went before is the next batch


def test_the_guard_keeps_priority_among_the_lower_levels(clock):
    """Levels 1, 2 and 3 backlogged, level 3 queued first: the guard's runs went to level 3 by
    age and level 2 got none of 30 (a review). The highest level below goes first."""
    from aclserve.scheduling.composition import PASSED_OVER_RUNS
    queue = PriorityQueue(BatchingConfig(), clock, lambda r: None)
    composer = Composer((), None, 1, batching=False, delay_s=0.0, just_in_time=True)
    push(queue, clock, 10, LOW)
    clock.advance(0.001)
    push(queue, clock, 10, 2)
    runs = []
    for _ in range(3 * (PASSED_OVER_RUNS + 1)):
        push(queue, clock, 1, HIGH)
        runs += levels(composer.next_batch(queue, clock.now())[0])
    assert runs == ([HIGH] * PASSED_OVER_RUNS + [2]) * 3


@pytest.mark.parametrize("high_rows, low_rows", [(3, 5), (5, 4), (30, 5), (16, 20)])
def test_a_lower_request_that_does_not_fit_beside_the_higher_rows_still_gets_in(clock, high_rows, low_rows):
    """The guard was reset whenever the higher level's gear had padding, though a lower request
    larger than that padding never got into the batch (a 5-row low behind 3-row highs waited
    for good), and near-full batches of highs (30 of 32 rows) starved a 5-row low before that
    too (a review). Judged on the batch taken, the low now goes first past the bound."""
    queue, composer = setup(clock)
    queue.push(QueuedRequest({}, low_rows, queue.level_for(LOW), clock.now(), None))
    batches = []
    while not batches or LOW not in batches[-1]:
        assert len(batches) < 100  # a hang guard
        queue.push(QueuedRequest({}, high_rows, queue.level_for(HIGH), clock.now(), None))
        batch, _ = composer.next_batch(queue, clock.now())
        batches.append(levels(batch))
        clock.advance(FLAT[32])
    assert batches[-1][0] == LOW and len(batches) >= 2  # passed over first, then in
