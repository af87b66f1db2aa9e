"""Priority levels with per-level policy, deadlines and O(1) removal."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator

from ..errors import QueueFull
from .clock import Clock
from .policy import BatchingConfig, QueuePolicy
from .request import DISPATCHED, QUEUED, REMOVED, QueuedRequest

# A deadline is measured on the clock its timeout message reports (Clock.now_ns, from the push), never
# the loop's: uvloop's loop.time() counts whole milliseconds and is read once a loop round, so a timer
# set on it fired up to a round plus a millisecond early (a 1 ms timeout "timed out after 0.1 ms").
# A timer found early is set again for what is left, at least this: uvloop rounds a timer's delay to
# whole milliseconds, and a shorter one, rounded to 0, would spin through loop rounds until the deadline.
TIMER_TICK_S = 0.001


def timeout_seconds(policy: QueuePolicy, timeout_us: int | None) -> float:
    """The queueing deadline of one request in seconds (0 = none).

    As QueuePolicy documents: the request's own timeout applies only when the level allows
    overrides and it is shorter than the default, or the default is 0. (Triton itself
    ignores the override when the default is 0; we let a client ask for a deadline.)"""
    default = policy.default_timeout_ms / 1000.0
    if timeout_us and timeout_us > 0 and policy.allow_timeout_override:
        own = timeout_us / 1e6
        if default == 0 or own < default:
            return own
    return default


def rejecting_deadline(config: BatchingConfig, priority: int | None, timeout_us: int | None) -> float:
    """Seconds a request of `priority` with its own `timeout_us` may wait (for a decode thread,
    then in its queue) before its deadline refuses it, 0 for none: no deadline, or one that
    delays it rather than refusing it (_delays)."""
    policy = config.policy_for(config.level_for(priority))
    return 0.0 if _delays(config, policy) else timeout_seconds(policy, timeout_us)


def _delays(config: BatchingConfig, policy: QueuePolicy) -> bool:
    """Whether a deadline passed moves the request back rather than refusing it. Under
    preserve_ordering a request moved back would hold every later answer, already computed,
    until it ran. The only deadline a delay level has there is a request's own timeout (config
    refuses the level's own beside it; Triton ignores the override where the level has none):
    it rejects."""
    return policy.timeout_action == "delay" and not config.preserve_ordering


class PriorityQueue:
    """Requests waiting for a batch: levels 1..N (1 is served first), FIFO within a level.

    Owns the queued requests and their deadline timers; event-loop thread only, never blocks.
    A full level rejects at once (QueueFull): a level's max_queue_size bounds its requests, or
    its rows where the policy counts rows (`auto`'s: QueuePolicy.counts_rows), where a request
    that does not fit is refused unless the level is empty (one larger than the bound is queued
    alone, not refused for good). When a deadline passes the timer acts at that
    moment: `reject` removes the request and hands it to `on_timeout` (the owner answers
    it), `delay` moves it behind the level's requests that are still within their deadline
    (under preserve_ordering it rejects too: see _expire).
    A deadline passes by the duration clock (Clock.now_ns, TIMER_TICK_S), never before.
    Each level is two OrderedDicts (on time, delayed) and a running count of its rows, so push,
    pop and removal are O(1).

    Timers: requests with their level's default deadline arrive in deadline order, so one
    timer per level, at the earliest of them, covers them all (a loop timer per request cost
    about 4 % of the light MLP's throughput); a request whose own shorter `timeout` applies
    has a timer of its own.
    """

    def __init__(self, config: BatchingConfig, clock: Clock,
                 on_timeout: Callable[[QueuedRequest], None],
                 on_delay: Callable[[QueuedRequest], None] | None = None):
        self.config = config
        self._clock = clock
        self._on_timeout = on_timeout
        self._on_delay = on_delay
        n = config.priority_levels
        self.levels = tuple(range(1, n + 1))
        self._policies = [config.policy_for(level) if level else None for level in range(n + 1)]
        self._on_time: list[OrderedDict] = [OrderedDict() for _ in range(n + 1)]  # [0] unused
        self._delayed: list[OrderedDict] = [OrderedDict() for _ in range(n + 1)]
        # Service order: on-time then delayed requests of level 1, then level 2, ...
        self._lanes = [lane for level in self.levels
                       for lane in (self._on_time[level], self._delayed[level])]
        self._default_s = [p.default_timeout_ms / 1000.0 if p else 0.0 for p in self._policies]
        self._lane_timer: list = [None] * (n + 1)  # per level: at its earliest default deadline
        self._level_rows = [0] * (n + 1)  # rows queued per level: the bound of those counting rows
        self.rows = 0  # rows of every queued request
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def level_for(self, priority: int | None) -> int:
        return self.config.level_for(priority)

    def room(self, level: int) -> int | None:
        """What `level` can still take, in its bound's unit (requests, or rows where it counts
        rows), or None when it is unbounded."""
        policy = self._policies[level]
        if not policy.max_queue_size:
            return None
        used = self._level_rows[level] if policy.counts_rows else self._level_count(level)
        return max(0, policy.max_queue_size - used)

    def full_error(self, level: int, rows: int | None = None, chosen: bool = False) -> QueueFull:
        """The refusal of a request of `rows` rows (None: not known yet) at the full `level`,
        named only where the request `chosen` it by its priority: one naming none was put in a
        level it never asked for, perhaps model_defaults' where its config.pbtxt declares none."""
        policy = self._policies[level]
        queue = f"priority level {level} queue" if chosen else "the queue"
        if not policy.counts_rows:  # ("is full (max_queue_size N)" as it was: clients may match it)
            return QueueFull(f"{queue} is full (max_queue_size {policy.max_queue_size}); "
                             f"{self._size_keys(level, auto=False)}")
        request = f"; this request's {rows} rows do not fit" if rows else ""
        return QueueFull(f"{queue} is full ({self._level_rows[level]} of its {policy.max_queue_size} rows "
                         f"queued{request}: max_queue_size auto counts rows); {self._size_keys(level)}")

    def _size_keys(self, level: int, auto: bool = True) -> str:
        """Where the full `level`'s size is set: its own policy's key, or default_queue_policy's, in a
        model's YAML; the same policy's field in a config.pbtxt (the batching config does not say which
        of the two gave it), but for an `auto` size: model_defaults', so its config.pbtxt has no
        dynamic_batching, whose levels, when given, replace model_defaults': default_queue_policy's."""
        own = level in self.config.priority_queue_policy
        policy = f"priority_queue_policy.{level}" if own else "default_queue_policy"
        pbtxt = ("default_queue_policy { max_queue_size: N }" if auto or not own
                 else f"priority_queue_policy {{ key: {level} value {{ max_queue_size: N }} }}")
        return (f"raise it in the model's config: batching.{policy}.max_queue_size (config.pbtxt: dynamic_batching "
                f"{{ {pbtxt} }}; 0: unbounded)")

    def push(self, request: QueuedRequest, timeout_us: int | None = None, chosen: bool = False) -> None:
        """Queue `request` at the tail of its level; raises QueueFull if the level has no room
        for it (where the level counts rows, its rows must fit, unless the level is empty).
        `chosen`: the request's priority chose its level (full_error names it then)."""
        level = request.level
        policy = self._policies[level]
        if policy.max_queue_size:
            if policy.counts_rows:
                queued = self._level_rows[level]
                if queued and queued + request.rows > policy.max_queue_size:
                    raise self.full_error(level, request.rows, chosen)
            elif self._level_count(level) >= policy.max_queue_size:
                raise self.full_error(level, chosen=chosen)
        self._on_time[level][request] = None
        self._level_rows[level] += request.rows
        self.rows += request.rows
        self.count += 1
        timeout = timeout_seconds(policy, timeout_us)
        if timeout:  # (less the time it waited for a decode thread before: those ahead waited none)
            request.deadline_ns = request.enqueued_ns - request.waited_ns + round(timeout * 1e9)
            due = request.enqueued - request.waited_ns / 1e9 + timeout  # on the loop's clock: it checks when it fires
            if timeout != self._default_s[level] or request.waited_ns:
                request.timer = self._clock.call_at(due, self._own_due, request)
            elif self._lane_timer[level] is None:
                self._lane_timer[level] = self._clock.call_at(due, self._lane_due, level)

    def remove(self, request: QueuedRequest) -> bool:
        """Take `request` out of the queue (cancelled, shut down); False if it was not queued."""
        if request.state != QUEUED:
            return False
        lane = self._delayed if request.delayed else self._on_time
        del lane[request.level][request]
        self._forget(request)
        request.state = REMOVED
        return True

    def take(self, max_rows: int, max_requests: int = 0) -> list[QueuedRequest]:
        """Pop requests in service order while their rows fit in `max_rows` (they become
        DISPATCHED: the caller now owns them).

        Stops at the first request that does not fit rather than skipping it, so a large
        request is never starved by smaller ones queued behind it."""
        taken: list[QueuedRequest] = []
        rows = 0
        for lane in self._lanes:
            while lane:
                request = next(iter(lane))
                if rows + request.rows > max_rows:
                    return taken
                self._dispatch(lane)
                rows += request.rows
                taken.append(request)
                if len(taken) == max_requests:
                    return taken
        return taken

    def take_all(self) -> list[QueuedRequest]:
        """Empty the queue (shutdown); the caller answers what it gets."""
        taken = [request for lane in self._lanes for request in lane]
        for lane in self._lanes:
            lane.clear()
        for request in taken:
            self._forget(request)
            request.state = REMOVED
        return taken

    def top_level(self) -> int | None:
        """The highest level with a request queued (1 is the highest), None when empty."""
        for level in self.levels:
            if self._on_time[level] or self._delayed[level]:
                return level
        return None

    def waiting_below(self, level: int) -> bool:
        """Whether a request of a lower level (a larger number) than `level` is queued."""
        return any(self._on_time[lower] or self._delayed[lower] for lower in self.levels[level:])

    def take_first_below(self, level: int) -> list[QueuedRequest]:
        """Pop the first request in service order among the levels below `level` (the highest
        of them first; within it, on time before delayed); it becomes DISPATCHED. [] when none
        is queued."""
        lane = next((lane for lane in self._lanes[2 * level:] if lane), None)
        return [] if lane is None else [self._dispatch(lane)]

    def _dispatch(self, lane: OrderedDict) -> QueuedRequest:
        """Pop `lane`'s head: it becomes DISPATCHED, the caller's."""
        request, _ = lane.popitem(last=False)
        self._forget(request)
        request.state = DISPATCHED
        return request

    def top_level_rows(self, cap: int) -> int:
        """Rows queued at the highest non-empty level, counted up to `cap` (O(cap))."""
        rows = 0
        for level in self.levels:
            for lane in (self._on_time[level], self._delayed[level]):
                for request in lane:
                    rows += request.rows
                    if rows >= cap:
                        return cap
            if rows:
                return rows
        return rows

    def oldest_enqueued(self) -> float | None:
        """Enqueue time of the oldest head of any lane (each lane is in arrival order, except
        that a delayed lane is in deadline order, which is close enough for a batch window)."""
        oldest = None
        for lane in self._lanes:
            if lane:
                enqueued = next(iter(lane)).enqueued
                if oldest is None or enqueued < oldest:
                    oldest = enqueued
        return oldest

    def depths(self) -> dict[int, int]:
        """Requests queued per level."""
        return {level: self._level_count(level) for level in self.levels}

    def _level_count(self, level: int) -> int:
        return len(self._on_time[level]) + len(self._delayed[level])

    def __iter__(self) -> Iterator[QueuedRequest]:
        """Queued requests in service order (for tests and diagnostics)."""
        for lane in self._lanes:
            yield from lane

    def _forget(self, request: QueuedRequest) -> None:
        self._level_rows[request.level] -= request.rows
        self.rows -= request.rows
        self.count -= 1
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        level = request.level
        if self._lane_timer[level] is not None and not self._on_time[level]:
            self._lane_timer[level].cancel()  # nothing left to time: no wake-up for nothing
            self._lane_timer[level] = None

    def _lane_due(self, level: int) -> None:
        """The level's timer: expire its default-deadline requests that are due, in order, and
        set the timer again for the first one that is not (a timer set for a request already
        taken just fires early and moves on)."""
        self._lane_timer[level] = None
        now_ns = self._clock.now_ns()
        expired = []
        for request in self._on_time[level]:
            if request.timer is not None or not request.deadline_ns:
                continue  # its own deadline (or none): not in this order
            if request.deadline_ns > now_ns:
                self._lane_timer[level] = self._clock.call_at(self._when(request, now_ns), self._lane_due, level)
                break
            expired.append(request)
        for request in expired:
            self._expire(request)

    def _own_due(self, request: QueuedRequest) -> None:
        """A request's own timer: expire it, unless its deadline has not passed yet."""
        now_ns = self._clock.now_ns()
        if request.state == QUEUED and request.deadline_ns > now_ns:
            request.timer = self._clock.call_at(self._when(request, now_ns), self._own_due, request)
            return
        self._expire(request)

    def _when(self, request: QueuedRequest, now_ns: int) -> float:
        """The loop time for a timer at `request`'s deadline, which has not passed by `now_ns`."""
        return self._clock.now() + max((request.deadline_ns - now_ns) / 1e9, TIMER_TICK_S)

    def _expire(self, request: QueuedRequest) -> None:
        """The deadline has passed (by Clock.now_ns): reject or delay `request`."""
        request.timer = None
        if request.state != QUEUED or request.delayed:
            return
        level = request.level
        if _delays(self.config, self._policies[level]):
            del self._on_time[level][request]
            self._delayed[level][request] = None
            request.delayed = True
            if self._on_delay is not None:
                self._on_delay(request)
            return
        self.remove(request)
        self._on_timeout(request)
