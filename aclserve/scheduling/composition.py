"""What the next run holds: which queued requests, on which compiled gear(s).

A batch holds requests in priority order (FIFO within a level) while they fit `batch_limit`
(the largest gear, or the configured `max_batch_size` when lower). It runs at once if it fills
a gear exactly or no more can fit; otherwise it waits until the oldest of its requests has
waited `max_queue_delay_ms`. A lone request waits so too, exact or not, while company is
expected (company.py: requests are arriving while others are pending). GearPlanner (gears.py)
chooses padding or a split. Under `just_in_time` formation, priority also bounds what a batch
commits the device to:
- a batch holding requests of a higher level takes lower-level rows only into its padding when
  that makes it markedly shorter at a bounded cost per row (GearPlanner.level_cut), so they are
  not slowed by rows they could run without; but lower levels left out of every batch taken
  for PASSED_OVER_COSTS times a full batch's cost get in: the first request of the highest of
  them goes first in the next batch, the others join as they fit (a few higher-level clients
  that keep the device busy would starve them otherwise);
- while a higher level is active (a batch it topped was taken within ACTIVE_S: its clients'
  next requests are expected), a batch of lower levels holds at most the planner's efficient
  gear (the smallest within COMMIT_WASTE of the cheapest cost per row), so a higher request
  arriving meanwhile waits behind a short run, not behind the largest gear.
Requests are never split (the batcher refuses one with more rows than `batch_limit`).
A static model (no gears), `enabled=False` and a batch limit of one row run one request per run,
in priority order; lower levels passed over PASSED_OVER_RUNS runs in a row get the next one
(the first request of the highest of them), under any formation: a few higher-level clients keeping the
device busy starved them until their deadlines (found by independent checks).

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

ACTIVE_S = 1.0  # a level whose batch was taken this recently is expected to send again
PASSED_OVER_COSTS = 2.0  # full batches' cost lower levels may be left out of batches in a row
PASSED_OVER_RUNS = 2  # one request per run: runs lower levels may be passed over in a row


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
        self._served_at: dict[int, float] = {}  # level -> when a batch it topped was taken
        self._passed_over_since: float | None = None  # lower levels left out of every batch since
        self._runs_passed_over = 0  # one request per run: runs in a row that lower levels waited through

    def next_batch(self, queue: PriorityQueue, now: float,
                   company_expected: bool = False) -> tuple[list[QueuedRequest] | None, float | None]:
        """(the requests of the next run, None) or, while a partial batch may wait, (None, the
        end of its window). `company_expected`: a lone request waits for company too."""
        if not self._batching or self._limit == 1:  # (a batch of one row is always full)
            return self._take_one(queue), None
        limit = self._commit_limit(queue, now)
        total = queue.rows
        runs_now = self._planner.is_exact(total) and not (company_expected and queue.count == 1)
        if total < limit and not runs_now:
            window_end = queue.oldest_enqueued() + self._delay
            if now < window_end - EARLY_S:
                return None, window_end
            return self._take(queue, min(limit, self._planner.take_limit(total)), now), None
        return self._take(queue, limit, now), None

    def _take_one(self, queue: PriorityQueue) -> list[QueuedRequest]:
        """One request: the highest level's head, unless lower levels have waited through
        PASSED_OVER_RUNS runs in a row."""
        top = queue.top_level()
        if top is not None and queue.waiting_below(top):
            self._runs_passed_over += 1
            if self._runs_passed_over > PASSED_OVER_RUNS:
                self._runs_passed_over = 0
                return queue.take_first_below(top)
        else:
            self._runs_passed_over = 0
        return queue.take(sys.maxsize if self.static else self._limit, 1)

    def _commit_limit(self, queue: PriorityQueue, now: float) -> int:
        """The batch limit; while a level above every queued one is active, the efficient gear."""
        if not self._just_in_time or not self._served_at:
            return self._limit
        top = queue.top_level()
        for level, taken_at in self._served_at.items():
            if top is not None and level < top and now - taken_at < ACTIVE_S:
                return min(self._limit, self._planner.efficient)
        return self._limit

    def _take(self, queue: PriorityQueue, limit: int, now: float) -> list[QueuedRequest]:
        lower_first = False
        if self._just_in_time:
            limit, lower_first = self._level_cut(queue, limit, now)
        top = queue.top_level()
        batch = queue.take_first_below(top) if lower_first else []
        # The head request may be larger than the limit: then take the batch whole.
        batch += queue.take(limit - sum(r.rows for r in batch)) or ([] if batch else queue.take(self._limit))
        if self._just_in_time:
            self._note_passed_over(queue, top, batch, now)
        if batch:
            self._served_at[top] = now
        return batch

    def _level_cut(self, queue: PriorityQueue, limit: int, now: float) -> tuple[int, bool]:
        """(rows to take, whether a lower level's request goes first): lower levels only fill a
        higher level's padding, unless they have been left out of every batch for
        PASSED_OVER_COSTS full batches' cost; then the first request of the highest of them
        goes first in the next batch, and the rest join it as they fit (after the higher
        level's rows, they did not fit whenever those filled it, or left less room than the
        next lower request's rows: a review saw them wait for good)."""
        rows = min(queue.rows, limit)
        since = self._passed_over_since
        if since is not None and now - since > PASSED_OVER_COSTS * self._planner.cost(self._planner.gear_for(rows)):
            return rows, True
        return self._planner.level_cut(queue.top_level_rows(limit), rows), False

    def _note_passed_over(self, queue: PriorityQueue, top: int | None, batch: list[QueuedRequest],
                          now: float) -> None:
        """Judged on the batch taken: lower levels wait on and none of their requests is in it."""
        if top is not None and queue.waiting_below(top) and all(r.level == top for r in batch):
            if self._passed_over_since is None:
                self._passed_over_since = now
        else:
            self._passed_over_since = None

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
