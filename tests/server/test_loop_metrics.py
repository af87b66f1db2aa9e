"""The request path's own counters and histograms render exactly as prometheus_client's."""
import random

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest

from aclserve.server.loop_metrics import LoopCounterFamily, LoopHistogramFamily
from aclserve.server.metrics import LATENCY_BUCKETS


def test_loop_families_render_like_prometheus_client():
    disable_created_metrics()  # as ServerMetrics does
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hist = LoopHistogramFamily("t_seconds", "a histogram", ["model"], LATENCY_BUCKETS)
    count = LoopCounterFamily("t_requests", "a counter", ["model", "reason"])
    ours.register(hist)
    ours.register(count)
    ref_hist = Histogram("t_seconds", "a histogram", ["model"], buckets=LATENCY_BUCKETS, registry=theirs)
    ref_count = Counter("t_requests", "a counter", ["model", "reason"], registry=theirs)
    rng = random.Random(7)
    values = [rng.choice(LATENCY_BUCKETS) for _ in range(50)]  # exactly on a bound: that bucket
    values += [rng.uniform(0, 12) for _ in range(200)] + [0.0, 99.0]
    for v in values:
        model = rng.choice(["a", "b"])
        hist.labels(model).observe(v)
        ref_hist.labels(model).observe(v)
        reason = rng.choice(["QueueFull", "InvalidInput"])
        count.labels(model, reason).inc()
        ref_count.labels(model, reason).inc()
    hist.labels("gone").observe(1.0)
    hist.remove("gone")
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_scrape_writes_the_figures_of_its_snapshot():
    """/metrics copies the figures on the event loop and writes the text in a worker thread: what
    the loop counts meanwhile must not reach that text, nor a series added or removed after."""
    from aclserve.server.metrics import ServerMetrics

    metrics = ServerMetrics(lambda index: [], lambda: [])
    kept = metrics.version("m", "1")
    kept.request_ok(0.001)
    kept.on_batch(4, 3, 0.002)
    gone = metrics.version("m", "2")
    gone.request_failed("InvalidInput")
    before = metrics.render().decode()
    snapshot = metrics.snapshot()
    kept.request_ok(0.5)  # after the snapshot: in-place updates of the copied numbers
    kept.on_batch(8, 8, 0.004)
    metrics.on_repository_event("unloaded", "m", "2")
    metrics.version("m", "3").request_ok(0.001)
    assert metrics.render(snapshot).decode() == before
    now = metrics.render().decode()
    assert now != before and 'version="2"' not in now and 'version="3"' in now
    # a scrape copies a version's series with its other figures, written in the order the families
    # hold them (their own frozen()'s): m/2 loaded again after m/3 comes after it
    metrics.on_repository_event("loaded", "m", "2")
    series = (metrics.success, metrics.failure, metrics.request_duration, metrics.queue_duration,
              metrics.compute_duration, metrics.batch_size, metrics.padding_rows)
    names = {family.name for family in series}
    taken = [family.rows for family in metrics.snapshot().families if family.name in names]
    assert taken == [family.frozen().rows for family in series]
    assert [row[0] for row in taken[0]] == [("m", "1"), ("m", "3"), ("m", "2")]
