"""A request's queue time ends where its batch starts on its instance (the launch, a trace's
COMPUTE_START), in the statistics, the request log, /metrics and the trace alike, as Triton's ends
at compute start. It ended at the batch's formation (a tester's find): the wait of a formed batch
for its instance was in the log's compute_ms and in no statistic. Real server, real port,
tritonclient, the CPU runtime; the trace's stamps are perf_counter_ns of this process (the server
runs in a thread here), so a moment this test reads is on their clock. No duration is bounded:
each check compares one measure with another of the same moments."""
from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as http

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, server_config

TRACING = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_format": "triton"}
ROUNDING_MS = 0.0005  # the request log's milliseconds have 3 decimals


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    traces = tmp_path_factory.mktemp("queue_traces")
    config = server_config(models_dir, request_log=True, trace_dir=str(traces),
                           model_defaults={"slots": 2, "execution_timeout_ms": 60_000})
    with ServerThread(config) as server:
        server.trace_dir = traces
        yield server


def _infer(url, request_id):
    with http.InferenceServerClient(url) as client:
        x = http.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        client.infer("double", [x], request_id=request_id)


def _traced(srv, name, run):
    """Run `run()` with every request traced into `name`; each request id's Triton stamps."""
    with http.InferenceServerClient(srv.url) as client:
        client.update_trace_settings(settings=dict(TRACING, trace_file=name))
        try:
            run()
        finally:
            client.update_trace_settings(settings={"trace_level": ["OFF"]})  # writes the file
    path, entries = srv.trace_dir / name, None
    for _ in range(600):  # a hang guard: the writer thread writes the file whole
        if path.exists():
            entries = json.loads(path.read_bytes())
            break
        time.sleep(0.05)
    assert entries is not None, f"{name} was never written"
    ids = {e["id"]: e["request_id"] for e in entries if "model_name" in e}
    stamps: dict[str, dict[str, int]] = {request_id: {} for request_id in ids.values()}
    for e in entries:
        for stamp in e.get("timestamps", ()):
            stamps[ids[e["id"]]][stamp["name"]] = stamp["ns"]
    return stamps


def _statistics(url) -> dict:
    with http.InferenceServerClient(url) as client:
        return client.get_inference_statistics("double")["model_stats"][0]["inference_stats"]


def _metrics(url) -> dict[str, float]:
    """The double model's series, by name and labels (one line each)."""
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    return {name: float(value) for name, value in re.findall(r'^(aclserve_\w+\{[^}]*model="double"[^}]*\}) (\S+)$',
                                                              text, re.MULTILINE)}


def _metric(metrics, family, **labels) -> float:
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(value for name, value in metrics.items()
               if name.startswith(family + "{") and all(label in name for label in wanted))


def _log_lines(caplog) -> dict[str, dict]:
    return {r.fields["request_id"]: r.fields for r in caplog.records
            if r.name == "aclserve.requests" and r.fields.get("model") == "double"}


def test_queue_ends_at_the_launch_in_the_log_the_statistics_the_metrics_and_the_trace(srv, caplog):
    """Eight clients at once (formed batches wait behind the running one, and for the launcher):
    per request, the log's queue_ms is the trace's QUEUE_START to COMPUTE_START, and queue_ms +
    compute_ms does not pass its REQUEST_END; the statistics' queue and the queue histogram's sum
    are those same nanoseconds, added up. Before, every log line's queue_ms fell short of the
    trace's by the formed batch's wait, and so did the statistics."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    ids = [f"q{i}" for i in range(48)]
    before, metrics_before = _statistics(srv.url), _metrics(srv.url)

    def load():
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda request_id: _infer(srv.url, request_id), ids))

    stamps = _traced(srv, "load.json", load)
    after, metrics_after = _statistics(srv.url), _metrics(srv.url)
    lines = _log_lines(caplog)
    assert sorted(stamps) == sorted(ids) and set(ids) <= set(lines)
    queued_ns = 0
    for request_id in ids:
        t, line = stamps[request_id], lines[request_id]
        queue_ns = t["COMPUTE_START"] - t["QUEUE_START"]
        queued_ns += queue_ns
        assert abs(line["queue_ms"] - queue_ns / 1e6) <= ROUNDING_MS + 1e-9, (request_id, line, queue_ns)
        to_result_ms = (t["REQUEST_END"] - t["QUEUE_START"]) / 1e6
        assert line["queue_ms"] + line["compute_ms"] <= to_result_ms + 2 * ROUNDING_MS, (request_id, line, t)
    delta = {key: (after[key]["count"] - before[key]["count"], after[key]["ns"] - before[key]["ns"])
             for key in ("success", "queue", "compute_input", "compute_infer", "compute_output")}
    assert delta["queue"] == (len(ids), queued_ns), (delta, queued_ns)
    assert sum(delta[key][1] for key in ("queue", "compute_input", "compute_infer", "compute_output")) \
        <= delta["success"][1], delta
    family = "aclserve_queue_duration_seconds"
    count = _metric(metrics_after, family + "_count") - _metric(metrics_before, family + "_count")
    seconds = _metric(metrics_after, family + "_sum") - _metric(metrics_before, family + "_sum")
    assert count == len(ids) and abs(seconds - queued_ns / 1e9) < 1e-6, (count, seconds, queued_ns)


def test_a_formed_batch_waiting_for_its_launcher_is_still_queued(srv, caplog, clean_faults):
    """The launcher held inside the first batch's execute call: the second request's batch is
    formed (its queue empty) and waits for the launcher, which takes it only once let go. Its
    queue runs to then in the log, the statistics and the histogram; before, it ended at the
    formation, before the test let the launcher go."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    gate = threading.Event()
    before, metrics_before = _statistics(srv.url), _metrics(srv.url)
    released: list[int] = []

    def run():
        held = faults.inject("execute_call", nth=1, hold=gate)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(_infer, srv.url, "held")
            try:
                assert held.entered.wait(60)  # the launcher is inside the first batch's launch
                accepted = _metric(_metrics(srv.url), "aclserve_queue_outcomes_total", outcome="accepted")
                second = pool.submit(_infer, srv.url, "behind")
                for _ in range(3000):  # a hang guard: until its request was queued and its batch formed
                    metrics = _metrics(srv.url)
                    if _metric(metrics, "aclserve_queue_outcomes_total", outcome="accepted") == accepted + 1 \
                            and _metric(metrics, "aclserve_queue_depth") == 0:
                        break
                    time.sleep(0.01)
                else:
                    raise AssertionError("the second request's batch was never formed")
                time.sleep(0.1)  # (formed well before the launcher is let go)
                released.append(time.perf_counter_ns())
            finally:
                gate.set()
            first.result(60)
            second.result(60)

    stamps = _traced(srv, "held.json", run)
    after, metrics_after = _statistics(srv.url), _metrics(srv.url)
    line = _log_lines(caplog)["behind"]
    waited_ns = released[0] - stamps["behind"]["QUEUE_START"]  # at least: queued before, launched after
    assert stamps["behind"]["COMPUTE_START"] >= released[0]
    assert line["queue_ms"] >= waited_ns / 1e6 - ROUNDING_MS, (line, waited_ns)
    assert after["queue"]["count"] - before["queue"]["count"] == 2
    assert after["queue"]["ns"] - before["queue"]["ns"] >= waited_ns
    family = "aclserve_queue_duration_seconds_sum"
    assert _metric(metrics_after, family) - _metric(metrics_before, family) >= waited_ns / 1e9 - 1e-6
