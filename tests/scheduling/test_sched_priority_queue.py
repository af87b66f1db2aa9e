"""PriorityQueue alone: levels, FIFO, capacity, deadlines (manual clock, no event loop)."""
import math

import pytest

from aclserve.errors import QueueFull
from aclserve.scheduling import BatchingConfig, PriorityQueue, QueuedRequest, QueuePolicy
from aclserve.scheduling.queue import rejecting_deadline, timeout_seconds
from aclserve.scheduling.request import DISPATCHED, QUEUED, REMOVED

from .conftest import ManualClock


def make_queue(clock, **config):
    timed_out, delayed = [], []
    queue = PriorityQueue(BatchingConfig(**config), clock, timed_out.append, delayed.append)
    return queue, timed_out, delayed


def request(queue, clock, tag, rows=1, priority=None, timeout_us=None):
    req = QueuedRequest({"tag": tag}, rows, queue.level_for(priority), clock.now(), None, clock.now_ns())
    queue.push(req, timeout_us, chosen=req.level == priority)  # as the batcher pushes it
    return req


def tags(requests):
    return [r.inputs["tag"] for r in requests]


def test_levels_in_priority_order_and_fifo_within_a_level(clock):
    queue, _, _ = make_queue(clock)
    for tag, priority in enumerate([3, 2, 1, None, 0, 1, 9, 3]):
        request(queue, clock, tag, priority=priority)
    # 0, None and out of range (9) fall back to the default level 2
    assert queue.depths() == {1: 2, 2: 4, 3: 2}
    assert tags(queue.take(100)) == [2, 5, 1, 3, 4, 6, 0, 7]
    assert len(queue) == 0 and queue.rows == 0


def test_take_stops_at_the_first_request_that_does_not_fit(clock):
    queue, _, _ = make_queue(clock)
    for tag, rows in enumerate([3, 4, 1]):
        request(queue, clock, tag, rows=rows)
    taken = queue.take(6)
    assert tags(taken) == [0]  # 1 would fit after 4 is skipped, but 4 is not starved
    assert all(r.state == DISPATCHED for r in taken)
    assert tags(queue.take(6, max_requests=1)) == [1]
    assert queue.rows == 1


def test_a_higher_level_request_that_does_not_fit_blocks_lower_levels(clock):
    queue, _, _ = make_queue(clock)
    request(queue, clock, 0, rows=3, priority=1)
    request(queue, clock, 1, rows=4, priority=1)
    request(queue, clock, 2, rows=1, priority=3)
    assert tags(queue.take(6)) == [0]
    assert tags(queue.take(6)) == [1, 2]


def test_full_level_rejects_at_once_and_other_levels_still_accept(clock):
    queue, _, _ = make_queue(clock, priority_queue_policy={2: QueuePolicy(max_queue_size=2)})
    request(queue, clock, 0)
    request(queue, clock, 1)
    own_level = ("raise it in the model's config: batching.priority_queue_policy.2.max_queue_size (config.pbtxt: "
                 "dynamic_batching { priority_queue_policy { key: 2 value { max_queue_size: N } } }; 0: unbounded)")
    with pytest.raises(QueueFull) as refused:
        request(queue, clock, 2)
    assert str(refused.value) == f"the queue is full (max_queue_size 2); {own_level}"
    with pytest.raises(QueueFull) as refused:
        request(queue, clock, 2, priority=2)
    assert str(refused.value) == f"priority level 2 queue is full (max_queue_size 2); {own_level}"
    request(queue, clock, 3, priority=1)
    assert queue.depths() == {1: 1, 2: 2, 3: 0}


def test_a_full_level_is_named_only_to_a_request_whose_priority_chose_it(clock):
    """A request naming no priority (or 0, or one out of range) was told "priority level 2 queue
    is full": a level it never asked for, model_defaults' where a tester's config.pbtxt declared
    no dynamic_batching. It is told "the queue is full"; one whose priority chose the level, which."""
    policy = QueuePolicy(max_queue_size=4, counts_rows=True)
    queue, _, _ = make_queue(clock, default_queue_policy=policy)
    request(queue, clock, 0, rows=4)
    for priority in (None, 0, 9):
        with pytest.raises(QueueFull) as refused:
            request(queue, clock, 1, rows=2, priority=priority)
        assert str(refused.value) == (
            "the queue is full (4 of its 4 rows queued; this request's 2 rows do not fit: max_queue_size auto counts "
            "rows); raise it in the model's config: batching.default_queue_policy.max_queue_size (config.pbtxt: "
            "dynamic_batching { default_queue_policy { max_queue_size: N } }; 0: unbounded)")
    with pytest.raises(QueueFull, match=r"^priority level 2 queue is full \(4 of its 4 rows queued; this"):
        request(queue, clock, 1, rows=2, priority=2)


def test_a_full_level_names_the_key_that_sets_its_size(clock):
    """A Triton user's perf_analyzer aborted on "the queue is full (64 of its 64 rows queued: max_queue_size
    auto counts rows)", which named no way out (t99): the refusal names the key of the full level's size,
    its own policy's where it has one, and a config.pbtxt's field."""
    auto = QueuePolicy(max_queue_size=2, counts_rows=True)
    queue, _, _ = make_queue(clock, default_queue_policy=auto, priority_queue_policy={1: auto})
    request(queue, clock, 0, rows=2, priority=1)
    request(queue, clock, 1, rows=2)
    with pytest.raises(QueueFull, match=r"counts rows\); raise it in the model's config: "
                                        r"batching\.priority_queue_policy\.1\.max_queue_size \(config\.pbtxt: "):
        request(queue, clock, 2, priority=1)
    with pytest.raises(QueueFull, match=r"counts rows\); raise it in the model's config: "
                                        r"batching\.default_queue_policy\.max_queue_size \(config\.pbtxt: "):
        request(queue, clock, 3)


def test_a_level_counting_rows_refuses_a_request_whose_rows_do_not_fit(clock):
    """`auto`'s size counts rows (QueuePolicy.counts_rows): counted in requests, a burst of full
    batches queued a full batch's times the runs its deadline is made for and waited it out."""
    policy = QueuePolicy(max_queue_size=16, counts_rows=True, default_timeout_ms=10)
    queue, timed_out, _ = make_queue(clock, default_queue_policy=policy)
    request(queue, clock, 0, rows=8)
    request(queue, clock, 1, rows=4)
    assert queue.room(2) == 4
    with pytest.raises(QueueFull, match=r"^the queue is full \(12 of its 16 rows queued; this request's 8 rows do"):
        request(queue, clock, 2, rows=8)
    request(queue, clock, 3, rows=4)  # fits exactly
    assert queue.room(2) == 0 and queue.depths() == {1: 0, 2: 3, 3: 0}
    with pytest.raises(QueueFull, match="max_queue_size auto counts rows"):
        request(queue, clock, 4)
    assert tags(queue.take(8)) == [0]  # taken rows make room again
    assert queue.room(2) == 8
    clock.advance(0.011)  # and so do those that time out
    assert tags(timed_out) == [1, 3] and queue.room(2) == 16 and queue.rows == 0


def test_a_request_larger_than_a_level_counting_rows_is_queued_alone(clock):
    """Not refused for good: queued when its level is empty, and then the level is full."""
    queue, _, _ = make_queue(clock, default_queue_policy=QueuePolicy(max_queue_size=16, counts_rows=True))
    big = request(queue, clock, 0, rows=40)
    assert queue.room(2) == 0
    with pytest.raises(QueueFull, match="40 of its 16 rows queued"):
        request(queue, clock, 1)
    request(queue, clock, 2, rows=40, priority=1)  # each level has rows of its own
    assert queue.remove(big) and queue.room(2) == 16


def test_a_configured_size_counts_requests_whatever_their_rows(clock):
    queue, _, _ = make_queue(clock, default_queue_policy=QueuePolicy(max_queue_size=2))
    request(queue, clock, 0, rows=32)
    assert queue.room(2) == 1
    request(queue, clock, 1, rows=32)
    with pytest.raises(QueueFull) as refused:
        request(queue, clock, 2)
    # (the key of a size set explicitly too: the batching config does not say whether YAML or a config.pbtxt set it)
    assert str(refused.value) == (
        "the queue is full (max_queue_size 2); raise it in the model's config: batching.default_queue_policy."
        "max_queue_size (config.pbtxt: dynamic_batching { default_queue_policy { max_queue_size: N } }; 0: unbounded)")
    assert queue.rows == 64


def test_reject_timeout_removes_the_request_at_its_deadline(clock):
    queue, timed_out, _ = make_queue(clock, default_queue_policy=QueuePolicy(default_timeout_ms=10))
    first = request(queue, clock, 0)
    clock.advance(0.005)
    second = request(queue, clock, 1)
    clock.advance(0.0049)
    assert timed_out == []
    clock.advance(0.0002)
    assert timed_out == [first] and first.state == REMOVED
    assert tags(queue) == [1] and second.state == QUEUED
    clock.advance(0.005)
    assert timed_out == [first, second] and len(queue) == 0


def test_delay_timeout_moves_the_request_behind_its_level(clock):
    policy = QueuePolicy(default_timeout_ms=0, timeout_action="delay")
    queue, timed_out, delayed = make_queue(clock, default_queue_policy=policy)
    late = request(queue, clock, 0, timeout_us=1000)
    request(queue, clock, 1)
    request(queue, clock, 2, timeout_us=50_000)
    clock.advance(0.002)
    assert delayed == [late] and timed_out == []
    request(queue, clock, 3)
    request(queue, clock, 4, priority=3)
    # delayed requests come after every on-time request of their level, before lower levels
    assert tags(queue) == [1, 2, 3, 0, 4]


def test_a_wait_for_a_decode_thread_before_the_push_counts_against_the_deadline(clock):
    """Pushed 1 ms after another, a request that waited 4 ms for a decode thread times out at
    7 ms, before the first (10 ms, the level's deadline): it has a timer of its own."""
    queue, timed_out, _ = make_queue(clock, default_queue_policy=QueuePolicy(default_timeout_ms=10))
    first = request(queue, clock, 0)
    clock.advance(0.001)
    waited = QueuedRequest({"tag": 1}, 1, queue.level_for(None), clock.now(), None, clock.now_ns())
    waited.waited_ns = 4_000_000
    queue.push(waited)
    clock.advance(0.0059)
    assert timed_out == []
    clock.advance(0.0002)
    assert timed_out == [waited]
    clock.advance(0.003)
    assert timed_out == [waited, first]


def test_the_deadline_of_the_wait_for_a_decode_thread_is_one_that_refuses():
    """What DecodePool.map is given to wait for a thread: the deadline that would refuse the
    request in its queue; none where the level delays (unless preserve_ordering makes it reject)."""
    def config(**policy):
        return BatchingConfig(default_queue_policy=QueuePolicy(**policy))
    assert rejecting_deadline(config(default_timeout_ms=10), None, None) == 0.010
    assert rejecting_deadline(config(default_timeout_ms=10), None, 5000) == 0.005
    assert rejecting_deadline(config(default_timeout_ms=0), None, None) == 0
    assert rejecting_deadline(config(default_timeout_ms=10, timeout_action="delay"), None, 5000) == 0
    ordered = BatchingConfig(preserve_ordering=True,
                             default_queue_policy=QueuePolicy(default_timeout_ms=0, timeout_action="delay"))
    assert rejecting_deadline(ordered, None, 5000) == 0.005


def test_removal_cancels_the_deadline_timer(clock):
    queue, timed_out, _ = make_queue(clock, default_queue_policy=QueuePolicy(default_timeout_ms=10))
    req = request(queue, clock, 0)
    assert clock.pending_timers == 1
    assert queue.remove(req) and not queue.remove(req)
    assert clock.pending_timers == 0 and len(queue) == 0
    clock.advance(1)
    assert timed_out == []


def test_taken_requests_do_not_time_out(clock):
    queue, timed_out, _ = make_queue(clock, default_queue_policy=QueuePolicy(default_timeout_ms=10))
    request(queue, clock, 0)
    queue.take(8)
    clock.advance(1)
    assert timed_out == []


@pytest.mark.parametrize("default_ms, allow, own_us, expected", [
    (0, True, None, 0),
    (0, True, 5000, 0.005),  # QueuePolicy: with no default deadline the request's own applies
    (10, True, 5000, 0.005),
    (10, True, 50_000, 0.010),  # longer than the default: ignored
    (10, False, 5000, 0.010),
    (0, False, 5000, 0),
])
def test_timeout_override_semantics(default_ms, allow, own_us, expected):
    policy = QueuePolicy(default_timeout_ms=default_ms, allow_timeout_override=allow)
    assert timeout_seconds(policy, own_us) == pytest.approx(expected)


def test_one_timer_per_level_times_its_default_deadlines_in_order(clock):
    """Requests with the level's default deadline share one timer; one with its own shorter
    timeout has its own; taking the head only makes the shared timer fire early and move on."""
    queue, timed_out, _ = make_queue(clock, default_queue_policy=QueuePolicy(default_timeout_ms=10))
    first = request(queue, clock, 0)
    clock.advance(0.002)
    request(queue, clock, 1)
    clock.advance(0.002)
    request(queue, clock, 2)
    short = request(queue, clock, 3, timeout_us=3000)
    assert clock.pending_timers == 2  # the level's, and the short one's own
    queue.take(1, 1)  # the first: the level's timer, set for it, fires at its deadline for nothing
    assert first.state == DISPATCHED
    clock.advance(0.0035)  # t = 7.5 ms: only the short one is due
    assert timed_out == [short]
    clock.advance(0.0050)  # t = 12.5 ms: the second (due at 12 ms), not the third (14 ms)
    assert tags(timed_out) == [3, 1] and clock.pending_timers == 1
    clock.advance(0.0020)
    assert tags(timed_out) == [3, 1, 2] and clock.pending_timers == 0 and len(queue) == 0


def waited_at_expiry(clock, **config):
    """A queue whose timed-out requests are recorded with how long they had waited then, by the
    duration clock (what the batcher's message reports)."""
    waited = {}
    queue = PriorityQueue(BatchingConfig(**config), clock,
                          lambda req: waited.setdefault(req.inputs["tag"], clock.now_ns() - req.enqueued_ns))
    return queue, waited


def test_a_default_deadline_is_not_expired_before_it_has_passed(clock):
    """The level's timer expired every request due within the next millisecond: with a 1 ms
    default deadline, one queued 0.5 ms after another timed out with it "after 0.5 ms", and
    one queued in the round its timer fired "after 0.0 ms"."""
    queue, waited = waited_at_expiry(clock, default_queue_policy=QueuePolicy(default_timeout_ms=1))
    request(queue, clock, 0)
    clock.advance(0.0005)
    request(queue, clock, 1)
    clock.advance(0.0005)
    request(queue, clock, 2)  # queued at the moment the level's timer is due
    clock.advance(0)
    assert waited == {0: 1_000_000}
    clock.advance(0.0015)
    assert sorted(waited) == [0, 1, 2] and min(waited.values()) >= 1_000_000 and len(queue) == 0


class CoarseLoopClock(ManualClock):
    """uvloop's loop clock: whole milliseconds, so it lags the duration clock by up to one."""

    def now(self) -> float:
        return math.floor(round(self._now * 1e6) / 1000) / 1000


@pytest.mark.parametrize("default_ms, timeout_us", [(1, None), (0, 1000)], ids=["level's timer", "own timer"])
def test_a_deadline_passes_by_the_clock_its_message_reports(default_ms, timeout_us):
    """A 1 ms deadline counted from the loop's coarse clock (a request queued at 100.0007 s
    read 100.000 there) fired 0.3 ms after its push: "timed out after 0.3 ms". It is measured
    on the duration clock: a timer that fires early is set again for the rest."""
    clock = CoarseLoopClock()
    queue, waited = waited_at_expiry(clock, default_queue_policy=QueuePolicy(default_timeout_ms=default_ms))
    clock.advance(0.0007)
    request(queue, clock, 0, timeout_us=timeout_us)
    clock.advance(0.0009)  # 0.9 ms later: the loop clock's deadline (100.001) is past, the request's is not
    assert waited == {} and len(queue) == 1
    clock.advance(0.0011)
    assert waited[0] >= 1_000_000 and len(queue) == 0 and clock.pending_timers == 0
