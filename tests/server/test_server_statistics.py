"""Statistics that perf_analyzer reads, on the real server (on uvloop, as in production) with the
digits model (about 0.1 ms of compute per run): durations have sub-millisecond resolution, and each request's queue +
compute input/infer/output adds up to no more than its time in the server.

Requests go one at a time with a statistics read between them, so every delta belongs to one
request. Nothing here bounds a duration: only the clocks' resolution and the breakdown's
consistency are checked."""
import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from aclserve.acl.cpu import faults

from tests import REPO
from tests.serving import ServerThread

KEYS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def digits_server(tmp_path_factory, make_config):
    """On uvloop, as `aclserve serve` runs: its loop.time() advances in whole milliseconds."""
    uvloop = pytest.importorskip("uvloop")
    models = tmp_path_factory.mktemp("digits_models")
    shutil.copy(REPO / "models" / "digits.om", models / "digits.om")
    with ServerThread(make_config(models), run=uvloop.run) as srv:
        yield srv


def totals(client) -> dict[str, tuple[int, int]]:
    stats = client.get_inference_statistics("digits")["model_stats"][0]["inference_stats"]
    return {key: (stats[key]["count"], stats[key]["ns"]) for key in KEYS}


def queued_within(url: str, bound: str) -> float:
    """digits' requests whose queue time was at most `bound` seconds, from /metrics' histogram."""
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    line = f'aclserve_queue_duration_seconds_bucket{{le="{bound}",model="digits",version="1"}} '
    return float(next(entry for entry in text.splitlines() if entry.startswith(line)).rsplit(" ", 1)[1])


def off_whole_ms(ns: int) -> bool:
    """More than 100 ns away from a whole millisecond (a millisecond clock's reading, turned
    into nanoseconds through a float, lands within a few ns of one)."""
    rest = ns % 1_000_000
    return min(rest, 1_000_000 - rest) > 100


def test_per_request_timings_are_sub_millisecond_and_add_up(digits_server):
    client = httpclient.InferenceServerClient(digits_server.url)
    x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][:1]
    inp = httpclient.InferInput("x", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    client.infer("digits", [inp])  # first contact outside the measured requests
    deltas = []
    fast_before = queued_within(digits_server.url, "0.0001")
    before = totals(client)
    for _ in range(10):
        client.infer("digits", [inp])
        after = totals(client)
        deltas.append({key: (after[key][0] - before[key][0], after[key][1] - before[key][1]) for key in KEYS})
        before = after
    client.close()
    # /metrics' queue histogram tells sub-0.2 ms waits apart (its lowest bucket was 0.2 ms: a tester, t83),
    # and agrees with the statistics request by request
    fast = queued_within(digits_server.url, "0.0001") - fast_before
    assert fast == sum(d["queue"][1] <= 100_000 for d in deltas), (fast, [d["queue"][1] for d in deltas])
    for d in deltas:
        assert all(count == 1 for count, _ in d.values()), d  # one request per delta
        parts = sum(d[key][1] for key in ("queue", "compute_input", "compute_infer", "compute_output"))
        assert 0 < parts <= d["success"][1], d  # the breakdown fits inside the request's time
    for key in ("success", "queue", "compute_infer"):
        assert any(off_whole_ms(d[key][1]) for d in deltas), [d[key][1] for d in deltas]
    for key in ("compute_input", "compute_output"):  # a lone batch's copies are timed too (they read 0)
        assert all(d[key][1] > 0 for d in deltas), [d[key][1] for d in deltas]


def _failures(url: str, reason: str) -> float:
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("aclserve_request_failure_total{") and f'reason="{reason}"' in line)


def _counts(client) -> dict[str, int]:
    stats = client.get_inference_statistics("digits")["model_stats"][0]
    inference = stats["inference_stats"]
    return {**{key: inference[key]["count"] for key in (*KEYS, "fail")},
            "inference_count": stats["inference_count"], "execution_count": stats["execution_count"]}


def test_statistics_and_metrics_count_the_same_failures(make_config, tmp_path, clean_faults):
    """A bad input and a client gone while its batch runs are failures in both the statistics
    extension and /metrics, and the request that ran for nobody adds no success, queue or
    compute count (as Triton's one aggregator: found by an independent check, where the
    statistics counted neither as a failure but counted the gone client's queue and compute)."""
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "digits.om")
    gate = threading.Event()
    with ServerThread(make_config(tmp_path, model_control_mode="none")) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        before = _counts(client)
        bad = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 3}]})
        request = urllib.request.Request(f"http://{srv.url}/v2/models/digits/infer", data=bad.encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400
        refused.value.close()  # its socket
        held = faults.inject("execute", nth=1, hold=gate)
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})
        host, port = srv.url.rsplit(":", 1)
        gone = socket.create_connection((host, int(port)))
        gone.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body.encode()))
        assert held.entered.wait(60)  # its batch runs
        gone.close()
        for _ in range(3000):  # a hang guard: until the server has seen the client go
            if _failures(srv.url, "Cancelled") == 1:
                break
            time.sleep(0.01)
        gate.set()
        for _ in range(3000):  # until the run that nobody waits for has ended
            if _counts(client)["execution_count"] > before["execution_count"]:
                break
            time.sleep(0.01)
        after = _counts(client)
        failures = _failures(srv.url, "Cancelled"), _failures(srv.url, "InvalidInput")
        client.close()
    delta = {key: after[key] - before[key] for key in after}
    assert failures == (1, 1) and delta["fail"] == 2 and delta["execution_count"] == 1, (failures, delta)
    assert delta["success"] == delta["queue"] == delta["compute_infer"] == delta["inference_count"] == 0, delta
