"""Composer under just-in-time formation: what priority lets a batch commit the device to
(a real PriorityQueue and GearPlanner, a manual clock, no event loop)."""
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
    assert len(batches) > 2 and batches[-1][0] == HIGH and LOW in batches[-1]
    assert bound < joined_after <= bound + 2 * FLAT[1]
