"""The compute-stream busy fraction: a sliding window over device times from events (the
batches' compute spans over the window's wall time); the instances' in-flight fraction."""
from __future__ import annotations

import random
import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.runtime import open_pool
from aclserve.runtime.busy import BusyWindow
from aclserve.runtime.futures import BatchFutures
from tests.tiny_models import affine_request


def test_busy_window_over_a_fake_clock():
    now = [0]
    window = BusyWindow(window_s=1.0, clock=lambda: now[0])
    now[0] = 2_000_000_000
    assert window.fraction() == 0.0
    window.add(300_000_000)  # 0.3 s of compute ending at t = 2 s
    assert abs(window.fraction() - 0.3) < 1e-9
    now[0] = 2_500_000_000  # half of that span has left the window
    assert abs(window.fraction() - 0.3) < 1e-9
    now[0] = 2_850_000_000
    assert abs(window.fraction() - 0.15) < 1e-9  # [1.85, 2.0] of [1.7, 2.0] is inside
    now[0] = 3_100_000_000
    assert window.fraction() == 0.0
    for k in range(30):  # more work than wall time (spans placed late) is capped at 1
        window.add(100_000_000, now[0] - k)
    assert window.fraction() == 1.0
    for k in range(1000):  # without reads it keeps only the window's spans
        now[0] += 10_000_000
        window.add(1_000_000)
    assert len(window._spans) <= 101


def test_a_span_still_going_on_counts_from_its_start_or_the_windows():
    now = [0]
    window = BusyWindow(window_s=1.0, clock=lambda: now[0])
    now[0] = 5_000_000_000
    window.add(200_000_000)  # [4.8, 5.0]
    now[0] = 5_400_000_000
    window.begin(5_300_000_000)
    assert abs(window.fraction() - 0.3) < 1e-9  # 0.2 + [5.3, 5.4]
    window.begin(1_000_000_000)
    assert window.fraction() == 1.0  # busy for longer than the window


def test_the_instances_in_flight_fraction_is_read_without_restarting_its_window(runtime, affine_om, clean_faults):
    """/metrics' aclserve_instance_busy_ratio counted from the previous scrape, so two scrapers
    (or a person's curl beside Prometheus) shortened each other's window to nothing: found by an
    accounting audit. A batch held on the device keeps the instance busy at every read."""
    pool = open_pool(runtime, affine_om(), "affine")
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        assert pool.busy_ratio() == 0.0
        held = faults.inject("execute", nth=1, hold=gate)
        future = done.submit([affine_request(1)], 1)
        while not held.fired:
            gate.wait(0.01)
        assert 0.0 < pool.busy_ratio() <= pool.busy_ratio()  # while it runs, growing
        gate.set()
        future.result(30)
        pool.busy_ratio()  # one scraper
        assert pool.busy_ratio() > 0.0  # the next: the span, ended, is still in its window
    finally:
        gate.set()
        pool.close()


def test_the_compute_stream_window_gets_each_batchs_compute_time_from_its_events(runtime, affine_om):
    """The instance's window (over a clock the test holds still) gets each batch's compute time
    as its events measured it, once per batch, and the pool reports that window's fraction."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2)
    done = BatchFutures(pool)
    try:
        instance = pool.instances[0]
        now = [0]
        instance._completer.compute_busy = BusyWindow(window_s=10.0, clock=lambda: now[0])  # (the one it feeds)
        now[0] = 10_000_000_000  # every batch ends "now": the window holds them all
        futures = [done.submit([affine_request(rows, first_id=10 * k)], 4) for k, rows in enumerate([1, 3, 4, 2] * 5)]
        computed = [future.result(30).timings.compute_ms for future in futures]
        assert all(ms > 0 for ms in computed)
        busy_ns = sum(int(ms * 1e6) for ms in computed)
        assert instance.compute_busy.fraction() == busy_ns / 10_000_000_000
        assert pool.utilisation()[0]["compute_busy"] == round(busy_ns / 10_000_000_000, 4)
    finally:
        pool.close()


def test_a_restarted_window_counts_from_then():
    now = [0]
    window = BusyWindow(window_s=10.0, clock=lambda: now[0])
    now[0] = 1_000_000_000
    window.add(500_000_000)  # half of the one second since creation
    assert abs(window.fraction() - 0.5) < 1e-9
    window.restart()
    now[0] = 2_000_000_000
    assert window.fraction() == 0.0
    window.begin(1_500_000_000)  # a span going on at the restart counts from then only
    window.restart()
    now[0] = 3_000_000_000
    assert abs(window.fraction() - 1.0) < 1e-9


def test_a_window_continued_from_another_holds_its_spans_and_the_time_since_as_idle():
    """A rebuilt instance's windows go on from the ones of the instance it replaces (pool.py)."""
    now = [0]
    earlier = BusyWindow(window_s=10.0, clock=lambda: now[0])
    now[0] = 4_000_000_000
    earlier.add(1_000_000_000)  # [3, 4]
    earlier.begin(5_000_000_000)  # a span still going on when it is replaced
    now[0] = 6_000_000_000
    later = BusyWindow(window_s=10.0, clock=lambda: now[0])
    later.add(500_000_000)  # its own, before it serves: not carried
    later.continue_from(earlier)
    now[0] = 8_000_000_000
    assert abs(later.fraction() - 2 / 8) < 1e-9  # [3, 4] and [5, 6] of [0, 8]
    earlier.end()  # the replaced one's window is its own: nothing more of it is heard
    now[0] = 14_500_000_000
    assert abs(later.fraction() - 1.0 / 10) < 1e-9  # [5, 6] is left in [4.5, 14.5]


def test_the_warm_up_does_not_read_as_utilisation(runtime, affine_om, clean_faults):
    """A new or reloaded version read about half busy for the next 10 s with no request (its
    warm-up runs in the window): an autoscaler saw every fresh replica as loaded."""
    from aclserve.runtime.warmup import warm_up
    pool = open_pool(runtime, affine_om(), "affine")
    try:
        faults.inject("execute", probability=1.0, delay_ms=20)  # runs long enough to show
        warm_up(pool)
        assert pool.busy_ratio() < 0.05 and all(row["compute_busy"] < 0.05 for row in pool.utilisation())
    finally:
        pool.close()


def test_the_running_total_reads_as_a_walk_over_every_span_would():
    """A read walks only the spans that may straddle the window's start; over random spans of
    mixed lengths (a long one among short ones, spans overlapping as the completion thread
    places them) and reads at random moments it gives what summing every span's part within
    the window gives."""
    rng = random.Random(7)
    now = [0]
    window = BusyWindow(window_s=1.0, clock=lambda: now[0])
    held: list[tuple[int, int]] = []
    for step in range(3000):
        now[0] += rng.randrange(0, 4_000_000)
        if rng.random() < 0.7:
            length = rng.choice((rng.randrange(1, 3_000_000), rng.randrange(1, 900_000_000)))
            window.add(length)
            held.append((now[0], length))
        if step % 7 == 0:
            start = now[0] - window.window_ns
            busy = sum(min(length, end - start) for end, length in held if end > start)
            expected = max(0.0, min(1.0, busy / min(window.window_ns, now[0])))
            assert window.fraction() == pytest.approx(expected, abs=1e-12), step
