"""GearPlanner: padding vs splitting by measured cost (pure functions)."""
import pytest

from aclserve.scheduling import BatchingConfig, GearPlanner, batch_limit

GEARS = (1, 2, 4, 8)


def test_batch_limit_is_the_top_gear_unless_configured_lower():
    assert batch_limit(GEARS, BatchingConfig()) == 8
    assert batch_limit(GEARS, BatchingConfig(batch_cap=6)) == 6
    assert batch_limit(GEARS, BatchingConfig(batch_cap=32)) == 8
    assert batch_limit((), BatchingConfig()) == 0  # static: no batch dimension


def test_pads_to_the_smallest_gear_that_fits():
    planner = GearPlanner(GEARS, {}, 8)
    assert [planner.gear_for(rows) for rows in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert planner.is_exact(4) and not planner.is_exact(5)


def test_a_configured_limit_below_a_gear_still_pads_to_that_gear():
    planner = GearPlanner(GEARS, {}, 6)
    assert planner.gear_for(6) == 8 and not planner.is_exact(8)


def test_one_free_slot_never_splits():
    planner = GearPlanner(GEARS, {}, 8)
    assert planner.plan([1] * 5, 5, free_slots=1) == [(5, 8)]


def test_five_rows_split_into_four_plus_one_when_cheaper():
    planner = GearPlanner(GEARS, {1: 1.0, 2: 1.2, 4: 1.5, 8: 4.0}, 8)
    assert planner.plan([1] * 5, 5, free_slots=2) == [(4, 4), (1, 1)]


def test_five_rows_pad_to_eight_when_the_big_gear_is_cheap():
    planner = GearPlanner(GEARS, {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0}, 8)
    assert planner.plan([1] * 5, 5, free_slots=4) == [(5, 8)]


def test_split_needs_a_clear_saving():
    # 4 + 1 costs 2.5 vs 2.6 for one padded run: less than SPLIT_SAVING, so pad
    planner = GearPlanner(GEARS, {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.6}, 8)
    assert planner.plan([1] * 5, 5, free_slots=2) == [(5, 8)]


def test_split_never_cuts_a_request_keeps_order_and_respects_free_slots():
    planner = GearPlanner(GEARS, {}, 8)  # unmeasured: cost proportional to the gear
    # 3+1 fills gear 4, then 2 fills gear 2, then 1: cost 7 against 8 for one padded run
    assert planner.plan([3, 1, 2, 1], 7, free_slots=3) == [(2, 4), (1, 2), (1, 1)]
    # with two slots the best is 4 + (2+1 padded to 4) = 8: no saving, one run
    assert planner.plan([3, 1, 2, 1], 7, free_slots=2) == [(4, 8)]
    assert planner.plan([2, 2, 1], 5, free_slots=3) == [(2, 4), (1, 1)]


def test_unmeasured_gears_scale_from_the_nearest_measured_one():
    planner = GearPlanner(GEARS, {8: 8.0}, 8)
    assert planner.cost(4) == pytest.approx(4.0)
    assert planner.cost(8) == pytest.approx(8.0)


def test_take_limit_leaves_rows_past_a_gear_queued_when_rows_cost_the_same_per_gear():
    # A compute-bound model (cost proportional to rows): padding 22 rows to 32 wastes 10 rows'
    # compute, so only 16 are taken and 6 wait for the next slot.
    gears = (1, 2, 4, 8, 16, 32)
    planner = GearPlanner(gears, {g: 0.001 * g for g in gears}, 32)
    assert planner.take_limit(22) == 16
    assert planner.take_limit(5) == 4


def test_take_limit_pads_when_a_run_costs_mostly_its_fixed_overhead():
    gears = (1, 2, 4, 8, 16, 32)
    planner = GearPlanner(gears, {g: 0.0002 + 0.000003 * g for g in gears}, 32)
    assert planner.take_limit(22) == 32
    assert GearPlanner(gears, {}, 32).take_limit(22) == 32  # unmeasured: pad


def test_level_cut_keeps_a_higher_level_on_its_own_gear_when_that_costs_bounded_throughput():
    linear = GearPlanner(GEARS, {g: g + 0.4 for g in GEARS}, 8)
    assert linear.level_cut(3, 8) == 4  # gear 8 costs twice gear 4: lower levels fill 1 padding row
    assert linear.level_cut(5, 8) == 8  # the top level needs gear 8 anyway
    assert linear.level_cut(4, 4) == 4  # nothing of a lower level queued
    assert linear.level_cut(1, 6) == 6  # gear 1 costs 1.4 per row against 1.05: > 25 % more
    assert linear.level_cut(2, 8) == 2  # gear 2 costs 1.2 per row: < 25 % more
    flat = GearPlanner(GEARS, {1: 1.05, 2: 2.1, 4: 4.2, 8: 8.4}, 8)
    assert flat.level_cut(1, 8) == 1
    nearly_free = GearPlanner(GEARS, {1: 4.0, 2: 4.0, 4: 4.0, 8: 4.3}, 8)
    assert nearly_free.level_cut(3, 8) == 8  # gear 8 costs < 10 % more: filling it is nearly free
    assert GearPlanner(GEARS, {}, 8).level_cut(3, 8) == 8  # no warm-up figures: fill, as before


def test_one_slow_warm_up_gear_does_not_flip_the_priority_decisions():
    """Per-row costs alike on every gear (a CPU), but gear 4's warm-up runs came out 30 % slow:
    read as measured, a run of gear 4 looked wasteful, so three high rows took 13 low ones
    along (gear 16) and priority stopped working for the whole run. The decisions read a line
    fitted to every gear."""
    gears = (1, 2, 4, 8, 16, 32)
    cost = {g: 0.0035 * g for g in gears}
    cost[4] *= 1.3
    planner = GearPlanner(gears, cost, 32)
    assert planner.level_cut(3, 16) == 4
    assert planner.efficient == 1
    assert GearPlanner(gears, {g: 0.002 + 0.0001 * g for g in gears}, 32).efficient == 32  # runs cost little per row
