"""Which compiled batch gear(s) a set of taken requests runs on: pad, or split by cost."""
from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from .policy import BatchingConfig

# Splitting takes more slots and more launches, so it must save at least this fraction of
# the single padded run's cost to be chosen.
SPLIT_SAVING = 0.10
# A batch holding a higher level's requests may run on their own gear (lower levels only in
# its padding) at up to this much more cost per row than the bigger gear: priority traded for
# a bounded share of throughput, with room for the noise of one warm-up measurement.
LEVEL_CUT_WASTE = 0.25
# While a higher level is active, a batch of lower levels only runs on the smallest gear that
# costs at most this much more per row than the cheapest: a higher request arriving meanwhile
# waits behind a short run, for a small share of throughput.
COMMIT_WASTE = 0.10


def batch_limit(gears: Sequence[int], config: BatchingConfig) -> int:
    """Rows one run may hold: the largest compiled gear unless the configured cap
    (`batch_cap`, YAML max_batch_size) is lower; 0 for a static model (no batch dimension, one
    request per run).
    It is what the protocol reports as the model's max_batch_size."""
    if not gears:
        return 0
    largest_gear = gears[-1]
    return min(config.batch_cap or largest_gear, largest_gear)


def one_request_per_run(gears: Sequence[int], config: BatchingConfig) -> bool:
    """Whether each run holds one request, with no batching window: a static model, batching
    off, or a batch limit of one row. (A request may still hold up to `batch_limit` rows.)"""
    return not gears or not config.enabled or batch_limit(gears, config) == 1


def estimate_costs(gears: Sequence[int], measured: Mapping[int, float]) -> dict[int, float]:
    """Seconds per gear: the measured figure, else the gear's size times the measured seconds
    per row of the nearest measured gear (or just its size when nothing was measured)."""
    costs = {}
    for gear in gears:
        figure = measured.get(gear)
        if figure is not None and figure > 0:
            costs[gear] = float(figure)
            continue
        known = [(abs(g - gear), c / g) for g, c in measured.items() if c and c > 0 and g > 0]
        costs[gear] = gear * (min(known)[1] if known else 1.0)
    return costs


def fit_line(gears: Sequence[int], cost: Mapping[int, float]) -> tuple[float, float]:
    """(fixed, per_row) of the line cost = fixed + per_row x gear through the gears' costs,
    Theil-Sen (the median of the slopes between every two gears, then the median intercept):
    one gear's outlier moves neither. Neither is below 0; a single gear is all fixed cost."""
    if len(gears) < 2:
        return (cost[gears[0]] if gears else 0.0), 0.0
    slopes = [(cost[b] - cost[a]) / (b - a) for i, a in enumerate(gears) for b in gears[i + 1:]]
    per_row = max(0.0, statistics.median(slopes))
    fixed = max(0.0, statistics.median(cost[g] - per_row * g for g in gears))
    return fixed, per_row


class GearPlanner:
    """Pure decisions over the executor's gears; built once per batcher, O(1) per lookup.

    `plan()` splits the taken requests (in service order, never splitting a request) into
    consecutive runs. The default is one run padded to the smallest gear that fits. A split
    is considered only when more than one slot is free: a prefix that fills a gear exactly
    runs on that gear and the rest is planned the same way (greedy, longest exact prefix
    first); the split wins if its summed cost is at least SPLIT_SAVING below the padded run.
    With one slot free, `take_limit()` makes the same trade by leaving the rows past the
    largest fitting gear in the queue instead of padding them.
    Costs are `gear_cost` from warm-up; gears without a measurement cost their size scaled by
    the measured seconds per row of the nearest measured gear (or just their size).
    """

    def __init__(self, gears: Sequence[int], gear_cost: Mapping[int, float], max_rows: int):
        self.gears = tuple(gears)
        self.max_rows = max_rows
        self._exact = frozenset(g for g in self.gears if g <= max_rows)
        # smallest gear >= rows, for rows in 0..max_rows (max_rows <= the top gear)
        self._pad = [None] * (max_rows + 1)
        for rows in range(1, max_rows + 1):
            self._pad[rows] = next(g for g in self.gears if g >= rows)
        self._cost = estimate_costs(self.gears, gear_cost)
        self._measured = any(c and c > 0 for c in gear_cost.values())
        # Priority's decisions (level_cut, efficient) compare gears a few percent apart, where
        # one slow warm-up run of a gear flipped them (an independent check saw it in about one
        # start in 14: gear 4 looked 25 % dearer per row, and priority stopped working for the
        # whole run). They read the costs through a straight line fitted to every gear instead:
        # a fixed cost per run plus a cost per row.
        self._fixed, self._per_row = fit_line(self.gears, self._cost)
        self.efficient = self._efficient_gear()

    def _fitted(self, gear: int) -> float:
        return self._fixed + self._per_row * gear

    def _efficient_gear(self) -> int:
        """The smallest gear within COMMIT_WASTE of the cheapest fitted cost per row (max_rows
        when nothing was measured)."""
        usable = sorted(self._exact)
        if not self._measured or not usable:
            return self.max_rows
        cheapest = min(self._fitted(g) / g for g in usable)
        return next(g for g in usable if self._fitted(g) / g <= cheapest * (1.0 + COMMIT_WASTE))

    def is_exact(self, rows: int) -> bool:
        return rows in self._exact

    def gear_for(self, rows: int) -> int:
        return self._pad[rows]

    def cost(self, gear: int) -> float:
        return self._cost[gear]

    def take_limit(self, total: int) -> int:
        """Rows to take from a queue holding `total` (< max_rows, not a gear) once its batch
        window has passed: all of it (padded), or only the largest gear below it when that runs
        at least SPLIT_SAVING cheaper per row; the rest stays queued, at the head, for the next
        free slot."""
        below = [g for g in self._exact if g < total]
        if not below or not self._measured:
            return self.max_rows  # without warm-up figures, padding is the safe default
        prefix = max(below)
        pad = self._pad[total]
        if self._cost[prefix] / prefix < (self._cost[pad] / total) * (1.0 - SPLIT_SAVING):
            return prefix
        return self.max_rows

    def level_cut(self, top_rows: int, rows: int) -> int:
        """Rows a batch may take when its `top_rows` rows of the highest queued level would be
        joined by lower levels up to `rows`: only the top level's own gear (lower levels fill
        its padding) when the bigger gear costs over SPLIT_SAVING more and the own gear costs
        at most LEVEL_CUT_WASTE more per row (so cutting costs bounded throughput); otherwise
        all of them."""
        own, full = self._pad[top_rows], self._pad[rows]
        if own == full or not self._measured:
            return rows
        own_cost, full_cost = self._fitted(own), self._fitted(full)
        if full_cost <= own_cost * (1.0 + SPLIT_SAVING):
            return rows  # filling up is nearly free
        if own_cost / own > full_cost / full * (1.0 + LEVEL_CUT_WASTE):
            return rows  # a run of the own gear would waste the device
        return own

    def plan(self, rows: Sequence[int], total: int, free_slots: int) -> list[tuple[int, int]]:
        """[(request count, gear), ...] covering `rows` in order; `total` = sum(rows)."""
        single = [(len(rows), self._pad[total])]
        if free_slots < 2 or total in self._exact or len(rows) < 2:
            return single
        best, best_cost = single, self._cost[self._pad[total]] * (1.0 - SPLIT_SAVING)
        runs: list[tuple[int, int]] = []
        spent, start, left = 0.0, 0, total
        while len(runs) + 1 < free_slots:
            cut, acc = None, 0
            for i in range(start, len(rows)):
                acc += rows[i]
                if acc >= left:
                    break
                if acc in self._exact:
                    cut = (i + 1, acc)
            if cut is None:
                break
            end, gear = cut
            runs.append((end - start, gear))
            spent += self._cost[gear]
            start, left = end, left - gear
            tail = self._pad[left]
            if spent + self._cost[tail] < best_cost:
                best, best_cost = runs + [(len(rows) - start, tail)], spent + self._cost[tail]
            if left in self._exact:
                break
        return best
