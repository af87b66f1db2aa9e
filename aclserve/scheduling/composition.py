"""What the next run holds: which queued requests, on which compiled gear(s).

A batch holds requests in priority order (FIFO within a level) while they fit `batch_limit`
(the largest gear, or the configured `max_batch_size` when lower). It runs at once if it fills
a gear exactly or no more can fit; otherwise it waits until the oldest of its requests has
waited `max_queue_delay_ms`. A lone request waits so too, exact or not, while company is
expected (company.py: requests are arriving while others are pending). GearPlanner (gears.py)
chooses padding or a split; under `just_in_time` formation a batch holding requests of a higher
level takes lower-level rows only into its padding when that makes it markedly shorter at a
bounded cost per row (GearPlanner.level_cut), so they are not slowed by rows they could run
without. Requests are never split (the batcher refuses one with more rows than `batch_limit`).
A static model (no gears) and `enabled=False` run one request per run.

Pure decisions over the batcher's queue, on the event loop thread: no timers (the batcher arms
one for the window's end).
"""
from __future__ import annotations

import sys

from .formation import EARLY_S
from .gears import GearPlanner
from .queue import PriorityQueue
from .request import QueuedRequest

Run = tuple[list[QueuedRequest], int | None]  # requests and their gear (None: a static model)


class Composer:
    """Owned by a DynamicBatcher; borrows its queue for each decision."""

    def __init__(self, gears: tuple[int, ...], planner: GearPlanner | None, batch_limit: int,
                 batching: bool, delay_s: float, just_in_time: bool):
        self.static = not gears
        self._planner = planner
        self._limit = batch_limit
        self._batching = batching
        self._delay = delay_s
        self._just_in_time = just_in_time

    def next_batch(self, queue: PriorityQueue, now: float,
                   company_expected: bool = False) -> tuple[list[QueuedRequest] | None, float | None]:
        """(the requests of the next run, None) or, while a partial batch may wait, (None, the
        end of its window). `company_expected`: a lone request waits for company too."""
        if not self._batching:
            return queue.take(sys.maxsize if self.static else self._limit, 1), None
        total = queue.rows
        runs_now = self._planner.is_exact(total) and not (company_expected and queue.count == 1)
        if total < self._limit and not runs_now:
            window_end = queue.oldest_enqueued() + self._delay
            if now < window_end - EARLY_S:
                return None, window_end
            return self._take(queue, self._planner.take_limit(total)), None
        return self._take(queue, self._limit), None

    def _take(self, queue: PriorityQueue, limit: int) -> list[QueuedRequest]:
        if self._just_in_time:  # lower levels only fill a higher level's padding
            limit = self._planner.level_cut(queue.top_level_rows(limit), min(queue.rows, limit))
        # The head request may be larger than the limit: then take the batch whole.
        return queue.take(limit) or queue.take(self._limit)

    def plan(self, batch: list[QueuedRequest], capacity: int) -> list[Run]:
        """The runs `batch` makes with `capacity` slots free: one, or a split (GearPlanner)."""
        if self.static:
            return [(batch, None)]
        rows = [request.rows for request in batch]
        total = sum(rows)
        if len(batch) == 1:
            return [(batch, self._planner.gear_for(total))]
        runs, start = [], 0
        for count, gear in self._planner.plan(rows, total, capacity):
            runs.append((batch[start:start + count], gear))
            start += count
        return runs
