"""A trace taken under load: valid Chrome trace JSON, one track per stream, spans nested in time
order on every track, every sampled request linked to its batch; Triton's JSON when asked; files
every log_frequency traces. Real server, real port, tritonclient, the CPU runtime."""
from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest
import tritonclient.http as http

from tests.serving import ServerThread, server_config

EPS_US = 0.01  # float microseconds of integer nanoseconds


def _inputs(rows, seed):
    rng = np.random.default_rng(seed)
    x = http.InferInput("x", [rows, 8], "FP32")
    x.set_data_from_numpy(rng.standard_normal((rows, 8)).astype(np.float32))
    idx = http.InferInput("idx", [rows, 3], "INT64")
    idx.set_data_from_numpy(rng.integers(0, 9, (rows, 3)).astype(np.int64))
    return [x, idx]


def _load(url, requests=120, clients=8):
    """`requests` infers from `clients` threads at once, rows 1-3, ids r0, r1, ..."""
    def one(i):
        client = http.InferenceServerClient(url)
        try:
            client.infer("affine", _inputs(1 + i % 3, i), request_id=f"r{i}")
        finally:
            client.close()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))


def _traced_server(models_dir, tmp_path, **trace):
    settings = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json")}
    settings.update(trace)
    config = server_config(models_dir, trace=settings, trace_dir=str(tmp_path / "traces"),
                           model_defaults={"slots": 2, "batching": {"max_queue_delay_ms": 0.2}})
    return ServerThread(config).start()


def _tracks(doc):
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    return processes, names


@pytest.fixture(scope="module")
def loaded_trace(models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    srv = _traced_server(models_dir, tmp)
    try:
        _load(srv.url)
    finally:
        srv.close()
    with open(tmp / "trace.json", "rb") as f:
        return json.loads(f.read())


def test_trace_is_chrome_json_with_one_track_per_stream_slot_and_thread(loaded_trace):
    doc = loaded_trace
    assert doc["otherData"]["requests"] == 120 and doc["otherData"]["dropped"] == 0
    processes, names = _tracks(doc)
    instances = [pid for pid, name in processes.items() if name.startswith("instance affine:1#0")]
    assert len(instances) == 1
    pid = instances[0]
    assert {"H2D stream", "compute stream", "D2H stream"} <= {n for (p, _), n in names.items() if p == pid}
    assert any(n.startswith("slot ") for (p, _), n in names.items() if p == pid)
    host = {n for (p, _), n in names.items() if processes[p] == "host threads"}
    assert {"event loop", "affine:1#0 launcher", "affine:1#0 completion"} <= host
    for e in doc["traceEvents"]:  # every event sits on a named track
        if e["ph"] in ("X", "s", "f", "i"):
            assert (e["pid"], e["tid"]) in names, e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] > 0
    computes = [e for e in doc["traceEvents"] if e["ph"] == "X" and names[(e["pid"], e["tid"])] == "compute stream"]
    assert any(e["name"].startswith("compute batch #") for e in computes) and all(e["pid"] == pid for e in computes)
    # besides executions, the compute stream's track holds only direct batches' copies (they ran there)
    direct = {e["name"].split()[1] for e in doc["traceEvents"]
              if e["ph"] == "X" and e["name"].startswith("batch #") and e["args"].get("direct")}
    copies = [e["name"].split()[2] for e in computes if not e["name"].startswith("compute batch #")]
    assert all(e["name"].startswith(("compute batch #", "H2D batch #", "D2H batch #")) for e in computes)
    assert set(copies) <= direct
    # a tid is unique in the file, whatever its process
    assert len({tid for _, tid in names}) == len(names)


def test_spans_nest_in_time_order_on_every_track(loaded_trace):
    by_track = {}
    for e in loaded_trace["traceEvents"]:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    assert len(by_track) >= 8
    for track, spans in by_track.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []  # a stack of enclosing spans' ends
        for e in spans:
            while open_ends and open_ends[-1] <= e["ts"] + EPS_US:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            if open_ends:  # inside the enclosing span: it must end inside it too
                assert end <= open_ends[-1] + EPS_US, (track, e)
            open_ends.append(end)


def test_every_sampled_request_is_linked_to_its_batch(loaded_trace):
    events = loaded_trace["traceEvents"]
    requests = [e for e in events if e["ph"] == "X" and e["name"].startswith("request ")]
    assert len(requests) == 120
    assert {e["args"]["request_id"] for e in requests} == {f"r{i}" for i in range(120)}
    batches = {e["args"]["batch"]: e for e in events if e["ph"] == "X" and e["name"].startswith("batch #")}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    for request in requests:
        trace_id = request["args"]["trace_id"]
        batch = batches[request["args"]["batch"]]
        start, finish = starts[trace_id], finishes[trace_id]
        assert (start["pid"], start["tid"]) == (request["pid"], request["tid"])
        assert request["ts"] <= start["ts"] <= request["ts"] + request["dur"]
        assert (finish["pid"], finish["tid"]) == (batch["pid"], batch["tid"])
        assert batch["ts"] - EPS_US <= finish["ts"] <= batch["ts"] + batch["dur"]
        assert start["ts"] <= finish["ts"] + EPS_US  # a request is dispatched before its batch launches
        rows = request["args"]["rows"]
        assert 1 <= rows <= batch["args"]["rows"] <= batch["args"]["gear"]
    # batch formation carries the gear, the padding and the priority mix
    formed = [e for e in events if e["ph"] == "i" and e["name"].startswith("form batch")]
    assert formed and all(e["args"]["padding"] == e["args"]["gear"] - e["args"]["rows"] for e in formed)
    assert all(sum(e["args"]["priority_mix"].values()) == e["args"]["requests"] for e in formed)


def test_device_spans_follow_stream_order(loaded_trace):
    """Placed with the device clock, a batch's compute starts after its copy-in and its
    copy-out after its compute: a pipelined batch's streams wait on those events; a direct
    batch (alone in flight) copies on its compute stream, timed by the events around them."""
    events = [e for e in loaded_trace["traceEvents"] if e["ph"] == "X"]
    direct = {int(e["name"].split("#")[1].split()[0]): e["args"]["direct"]
              for e in events if e["name"].startswith("batch #")}
    by_batch = {}
    for e in events:
        head, _, tail = e["name"].rpartition("#")
        if head in ("H2D batch ", "compute batch ", "D2H batch "):
            by_batch.setdefault(int(tail), {})[head.split()[0]] = e
    assert by_batch and not all(direct.values())
    for bid, parts in by_batch.items():
        compute = parts["compute"]
        copy_in, copy_out = parts.get("H2D"), parts.get("D2H")
        assert copy_in and copy_out, parts
        assert copy_in["ts"] + copy_in["dur"] <= compute["ts"] + EPS_US
        assert compute["ts"] + compute["dur"] <= copy_out["ts"] + EPS_US


def test_triton_format_and_log_frequency_files(models_dir, tmp_path):
    srv = _traced_server(models_dir, tmp_path, format="triton", log_frequency=5)
    try:
        _load(srv.url, requests=12, clients=1)
        with http.InferenceServerClient(srv.url) as client:
            client.update_trace_settings(settings={"trace_level": ["OFF"]})  # writes the last 2
    finally:
        srv.close()
    counts = []
    for index in range(3):
        with open(tmp_path / f"trace.json.{index}", "rb") as f:
            entries = json.loads(f.read())
        heads = [e for e in entries if "model_name" in e]
        counts.append(len(heads))
        assert all(h["model_name"] == "affine" and h["model_version"] == 1 for h in heads)
        for head in heads:
            stamps = [e["timestamps"][0] for e in entries if e["id"] == head["id"] and "timestamps" in e]
            names = [s["name"] for s in stamps]
            assert names == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
                             "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
                             "HTTP_SEND_START", "HTTP_SEND_END"]
            ns = [s["ns"] for s in stamps]
            assert ns == sorted(ns), names
    assert counts == [5, 5, 2]
    assert not (tmp_path / "trace.json.3").exists()


def test_under_load_some_batches_overlap_on_the_streams(loaded_trace):
    """Eight clients keep two batches in flight at times: those take the three streams."""
    batches = [e for e in loaded_trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("batch #")]
    assert any(not b["args"]["direct"] for b in batches)
    assert any(e["ph"] == "X" and e["name"].startswith("H2D batch #") for e in loaded_trace["traceEvents"])
