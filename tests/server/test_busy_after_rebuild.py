"""The utilisation figures across an instance's rebuild: a rebuilt instance goes on with the busy
windows of the one it replaces (runtime/pool.py, ModelInstance.continue_busy)."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, post_status

from .hostile import metric, wait_for

GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
WINDOW_S = 10.0  # what the gauges' help texts and README say they cover


def infer(url: str) -> int:
    return post_status(url, "/v2/models/double/infer", GOOD)


def read(url: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{url}{path}", timeout=60) as resp:
        return resp.read()


def test_a_rebuilt_instance_keeps_its_predecessors_busy_time_in_the_window(double_dir, make_config, clean_faults):
    """Found by a tester: a rebuild put in an instance with windows of its own, so for 10 s the
    gauges read the busy time since the rebuild over the time since it (3.5 times the statistics'
    compute over the last 10 s with load after a fault; here, with none after it, 0). The one
    batch that ran before the fault is compared with the statistics' compute time: it lies in the
    window while the scrape ends less than 10 s after it was sent, and no
    window has more than all the compute over at least the time since the model was ready. (On a
    machine so slow that the scrape ends 10 s after the batch was sent, the batch may have left the
    window: the upper bounds are checked, then the test fails saying the lower one, the bug's,
    could not be judged.)"""
    srv = ServerThread(make_config(double_dir)).start()
    try:
        ready_at = time.perf_counter()  # (the server's clock too: the windows start at the warm-up's end, before)
        faults.inject("execute", nth=1, count=1, delay_ms=200)  # one batch with compute time to show
        sent_at = time.perf_counter()
        assert infer(srv.url) == 200
        faults.inject("execute", nth=1, count=1)  # the next fails: its instance leaves rotation, is rebuilt
        assert infer(srv.url) != 200
        labels = 'model="double",version="1"'
        asyncio.run(wait_for(lambda: metric(srv.url, "aclserve_instance_rebuilds_total", labels) == 1, limit_s=60))
        scraping_at = time.perf_counter()
        text = read(srv.url, "/metrics").decode()
        (entry,) = json.loads(read(srv.url, "/v2/models/double/stats"))["model_stats"]
        scraped_at = time.perf_counter()
    finally:
        srv.close()
    compute_s = sum(size["compute_infer"]["ns"] for size in entry["batch_stats"]) / 1e9
    assert compute_s >= 0.2  # the one batch that ran: its execution's events
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (compute_gauge,) = [s.value for s in families["aclserve_compute_busy_ratio"].samples
                        if s.labels["model"] == "double"]
    (in_flight,) = [s.value for s in families["aclserve_instance_busy_ratio"].samples if s.labels["model"] == "double"]
    (row,) = entry["utilisation"]
    at_most = compute_s / min(WINDOW_S, scraping_at - ready_at) + 1e-4  # (the figures are rounded to 4 places)
    for figure in (compute_gauge, row["compute_busy"]):
        assert figure <= at_most, (figure, compute_s, scraping_at - ready_at)
    if scraped_at - sent_at >= WINDOW_S:  # (a lower bound of 0 would pass the old code: not passed)
        pytest.fail(f"too slow to judge: the rebuild and the scrape took {scraped_at - sent_at:.1f} s, so the "
                    f"batch may have left the {WINDOW_S:g} s window; the upper bounds held, the lower one (what "
                    "the rebuild lost) was not checked")
    at_least = compute_s / WINDOW_S
    for figure in (compute_gauge, row["compute_busy"]):
        assert figure >= at_least - 1e-4, (figure, compute_s, scraped_at - sent_at)
    assert in_flight >= at_least - 1e-4, (in_flight, compute_s)  # in flight covers its compute, and copies
