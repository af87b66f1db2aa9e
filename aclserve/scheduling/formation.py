"""When the next batch of each instance is formed: just in time for its compute stream.

A batch that is formed is committed: its requests are packed, copied in and queued on the
instance's compute stream, and no later request can overtake them. Forming batches as soon as
a slot frees (`when_slot_free`) commits a whole batch behind the running one, so a request of
a higher level that arrives meanwhile waits for both. `just_in_time` (the default) commits as
late as the device allows:

- an idle instance (nothing booked on it) takes a batch at once;
- an instance with one batch booked takes the next one when that batch's predicted result
  time, minus the lead, has come: the lead is the longest non-compute time of a run (pack,
  copy in, copy out, hand-offs: a gear's warm-up run time minus its device compute time), so
  the new batch is copied in by the time the compute stream is free;
- an instance with two batches booked (one executing, one waiting) takes nothing until a
  result comes back: at most one batch per instance waits behind the one executing.

The predicted result time of a booked batch is its booking time plus its gear's lone run time
when the instance was idle, otherwise the previous batch's predicted result time plus the
gear's compute time; when a result arrives, the batches behind it are re-anchored on that
moment. Compute times start from warm-up and follow what the device reports: the median of
each gear's last COMPUTE_RUNS runs, which one slow run (the host preempted) does not move.

The lead adapts, because under load hand-offs between threads take longer than at warm-up
and results arrive with jitter. It grows when the compute stream sat idle: by how early a
result came when it found nothing formed while requests were waiting (a miss), and by half
of the idle time beyond IDLE_TOLERANCE_S when a batch booked behind another came back later
than one compute time after it (it was formed too late). Otherwise every result with the
next batch already behind it shortens the lead by LEAD_DECAY. It stays between the warm-up
figure and LEAD_MAX_SHARE of the longest gear's compute time (or the warm-up figure where that
is more: a light model whose host time is most of a run), so a busy instance never commits
more than that ahead of the batch it runs.

Without warm-up figures (a static model) an instance takes its next batch as soon as it has at
most one booked, which is what `when_slot_free` does with two slots.

Pure bookkeeping on the event loop thread: no threads, no ACL, no timers (the batcher arms
one for `choose()`'s next moment).
"""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

from .gears import estimate_costs
from .policy import FORMATION_MODES

JUST_IN_TIME, WHEN_SLOT_FREE = FORMATION_MODES

# uvloop's clock and timers tick in whole milliseconds and a timer's delay is rounded to the
# nearest one, so a timer may fire up to half a millisecond before its moment: a moment counts
# as come that much early. Then a timer re-armed for a moment still ahead is at least one tick
# away, and never fires again and again within the same tick.
EARLY_S = 0.0005
COMPUTE_RUNS = 9  # reported compute times per gear whose median predicts the next
WAITING_MAX = 1  # batches booked behind the executing one
LEAD_DECAY = 0.02  # the lead's shrink per result that found its successor already formed
LEAD_MAX_SHARE = 0.5  # the lead's ceiling, as a share of the longest gear's compute time (or the warm-up lead)
# Idle time of the compute stream that the lead tolerates before growing by half of the rest:
# results are seen on a clock that ticks in milliseconds (uvloop).
IDLE_TOLERANCE_S = 2 * EARLY_S


class GearTimes:
    """Seconds per gear: `cost` = a lone run, submit to result (warm-up); `compute` = the
    device's compute time (warm-up, then the median of the last runs' reports)."""

    def __init__(self, gears: Sequence[int], gear_cost: Mapping[int, float],
                 compute_cost: Mapping[int, float]):
        self.gears = tuple(gears)
        measured_cost = {g: c for g, c in gear_cost.items() if c and c > 0}
        measured_compute = {g: c for g, c in compute_cost.items() if c and c > 0}
        self.known = bool(gears) and bool(measured_cost) and bool(measured_compute)
        self._cost = estimate_costs(gears, measured_cost) if self.known else {}
        self._compute = estimate_costs(gears, measured_compute) if self.known else {}
        self._recent: dict[int, collections.deque] = {}
        # The lead is taken from warm-up once: it is what a run costs besides the device.
        self.lead = max((max(self._cost[g] - self._compute[g], 0.0) for g in gears), default=0.0) \
            if self.known else 0.0

    def cost(self, gear: int | None) -> float:
        return self._cost.get(gear, 0.0)

    def compute(self, gear: int | None) -> float:
        return self._compute.get(gear, 0.0)

    def observe(self, gear: int | None, compute_s: float) -> None:
        if not self.known or compute_s <= 0 or gear not in self._compute:
            return
        recent = self._recent.setdefault(gear, collections.deque([self._compute[gear]], COMPUTE_RUNS))
        recent.append(compute_s)
        self._compute[gear] = sorted(recent)[(len(recent) - 1) // 2]  # the lower median


class _Lane:
    """One instance's booked batches in compute order: [run, earliest result time, booked
    behind another]."""

    __slots__ = ("booked", "result_at", "done_at")

    def __init__(self):
        self.booked: list[list] = []
        self.result_at = 0.0  # predicted moment the last booked batch's result arrives
        self.done_at: float | None = None  # the previous result's moment, while more are booked


class Formation:
    """Per instance ("lane"): what the batcher booked there and when it needs its next batch."""

    def __init__(self, times: GearTimes, mode: str = JUST_IN_TIME):
        if mode not in FORMATION_MODES:
            raise ValueError(f"batch formation must be one of {', '.join(FORMATION_MODES)}")
        self.times = times
        self.just_in_time = mode == JUST_IN_TIME
        self._lanes: list[_Lane] = []
        self._last = -1  # the lane booked last: idle lanes are offered in turn after it
        self.lead = times.lead  # seconds before a busy lane's predicted result its next batch is formed

    def choose(self, free: Sequence[int], now: float) -> tuple[list[tuple[int, int]], float | None]:
        """Lanes that take a batch now, as (lane, batches it may take), idle lanes first (in turn: from the
        one after the lane booked last, so that one batch at a time does not always go to the first instance,
        its device hotter than the others), then busy ones by their moment; and the earliest moment
        a busy lane will need one (None when only a result or a freed slot can change anything)."""
        while len(self._lanes) < len(free):
            self._lanes.append(_Lane())
        idle, busy, later = [], [], None
        for index, slots in enumerate(free):
            if slots <= 0:
                continue
            lane = self._lanes[index]
            booked = len(lane.booked)
            if not self.just_in_time:
                idle.append((index, slots))
            elif booked == 0:
                idle.append((index, min(slots, WAITING_MAX + 1)))
            elif booked <= WAITING_MAX:
                at = self.need_at(index)
                if now >= at - EARLY_S:
                    busy.append((at, index))
                elif later is None or at < later:
                    later = at
        idle.sort(key=lambda entry: (entry[0] - self._last - 1) % len(free))
        busy.sort()
        return idle + [(index, 1) for _, index in busy], later

    def need_at(self, index: int) -> float:
        """When lane `index` needs its next batch formed (its last booked result minus the lead;
        -inf without warm-up figures)."""
        if not self.times.known:
            return float("-inf")
        return self._lanes[index].result_at - self.lead

    def booked(self, index: int, run, now: float) -> None:
        lane = self._lanes[index]
        self._last = index
        times = self.times
        earliest = now + times.cost(run.gear)
        lane.result_at = (max(lane.result_at + times.compute(run.gear), earliest) if lane.booked
                          else earliest)
        lane.booked.append([run, earliest, bool(lane.booked)])

    def finished(self, index: int | None, run, now: float, compute_s: float, waiting: bool) -> None:
        """`run`'s outcome reached the loop at `now` (`waiting`: requests are queued); the
        batches behind it re-anchor on now, and the lead learns whether it was long enough."""
        if index is None or index >= len(self._lanes):
            return
        lane = self._lanes[index]
        position = next((k for k, entry in enumerate(lane.booked) if entry[0] is run), None)
        if position is None:
            return
        _, _, was_behind = lane.booked.pop(position)
        self.times.observe(run.gear, compute_s)
        if position != 0 or not self.just_in_time or not self.times.known:
            return
        # (never below the warm-up's figure: a light model's host time past half its compute made
        # a miss cut the lead tenfold, a reviewer)
        longest = max(LEAD_MAX_SHARE * max(self.times.compute(g) for g in self.times.gears), self.times.lead)
        # A batch booked behind another should come back one compute time after it; more is
        # time the device sat idle because this batch was formed too late.
        idle = now - lane.done_at - (compute_s or self.times.compute(run.gear)) \
            if was_behind and lane.done_at is not None else 0.0
        if idle > IDLE_TOLERANCE_S:
            self.lead = min(self.lead + (idle - IDLE_TOLERANCE_S) / 2, longest)
        elif lane.booked:
            self.lead = max(self.lead * (1.0 - LEAD_DECAY), self.times.lead)
        if lane.booked:
            lane.done_at = at = now
            for behind, earliest, _ in lane.booked:
                at = max(at + self.times.compute(behind.gear), earliest)
            lane.result_at = at
        else:
            lane.done_at = None
            if waiting:  # a miss: the device falls idle while requests wait
                self.lead = min(self.lead + max(lane.result_at - now, EARLY_S), longest)
