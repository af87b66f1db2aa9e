"""A batch the device failed is re-run one request per run (runtime/isolation.py); the traces of
its requests stayed linked to the failed batch, so they showed its launch (COMPUTE_START) and no
other compute stamp, in both formats (a tester: 155 re-run requests, none with its run). Each
re-run request now links to the run that answered it. Real server on a real port, fault injection
in the CPU runtime, the trace file the server writes at shutdown."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading

import numpy as np
import tritonclient.http as http

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, server_config

from .hostile import wait_for
from .test_batch_isolation import queued

QUEUED = 4  # requests batched together behind the held first one: their batch fails, each re-runs alone


def _infer(url: str, index: int) -> None:
    rng = np.random.default_rng(index)
    x = http.InferInput("x", [1, 8], "FP32")
    x.set_data_from_numpy(rng.standard_normal((1, 8)).astype(np.float32))
    idx = http.InferInput("idx", [1, 3], "INT64")
    idx.set_data_from_numpy(np.array([[index, index, index]], np.int64))
    with http.InferenceServerClient(url) as client:
        answer = client.infer("affine", [x, idx], request_id=f"r{index}")
    assert (answer.as_numpy("s") == 2 * index).all()


def _traced_run(models_dir, tmp_path, fmt: str):
    """Every request traced into `fmt`; r0's run held while r1..r4 queue, then their batch fails
    once and each is re-run alone (and answered). The trace file's JSON."""
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": fmt}
    config = server_config(models_dir, trace=trace, trace_dir=str(tmp_path / "traces"),
                           model_defaults={"slots": 1})  # the held run keeps the only slot: the rest queue
    srv = ServerThread(config).start()
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate)
        faults.inject("execute", nth=2)  # the batch of the queued requests fails on the device
        with concurrent.futures.ThreadPoolExecutor(QUEUED + 1) as pool:
            first = pool.submit(_infer, srv.url, 0)
            assert held.entered.wait(30)
            rest = [pool.submit(_infer, srv.url, i) for i in range(1, QUEUED + 1)]
            asyncio.run(wait_for(lambda: queued(srv.url, "affine") == QUEUED, limit_s=30))
            gate.set()
            for future in [first] + rest:
                future.result()
    finally:
        gate.set()
        srv.close()
    return json.loads((tmp_path / "trace.json").read_bytes())


def test_a_re_run_request_has_its_own_runs_compute_in_triton_traces(models_dir, tmp_path, clean_faults):
    entries = _traced_run(models_dir, tmp_path, "triton")
    ids = {e["request_id"]: e["id"] for e in entries if "request_id" in e}
    stamps = {rid: {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
                    if e["id"] == tid and "timestamps" in e} for rid, tid in ids.items()}
    names = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
             "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    runs = []
    for rid in [f"r{i}" for i in range(QUEUED + 1)]:
        assert list(stamps[rid]) == names, (rid, stamps[rid])
        assert list(stamps[rid].values()) == sorted(stamps[rid].values()), rid
        runs.append((stamps[rid]["COMPUTE_START"], stamps[rid]["COMPUTE_END"]))
    # the re-runs ran one at a time, each after r0's run: no two compute spans share a moment
    runs.sort()
    assert all(end < start for (_, end), (start, _) in zip(runs, runs[1:])), runs


def test_a_re_run_request_links_to_its_own_run_and_its_failed_batch_in_chrome_traces(models_dir, tmp_path,
                                                                                      clean_faults):
    doc = _traced_run(models_dir, tmp_path, "chrome")
    events = doc["traceEvents"]
    requests = {e["args"]["request_id"]: e for e in events if e["ph"] == "X" and e["name"].startswith("request r")}
    batches = {e["args"]["batch"]: e for e in events if e["ph"] == "X" and e["name"].startswith("batch #")}
    formed = {e["args"]["batch"]: e for e in events if e["ph"] == "i" and e["name"].startswith("form batch #")}
    computes = {int(e["name"].split("#")[1]) for e in events
                if e["ph"] == "X" and e["name"].startswith("compute batch #")}
    arrows = {e["id"]: e for e in events if e["ph"] == "f"}
    re_runs = [requests[f"r{i}"]["args"]["batch"] for i in range(1, QUEUED + 1)]
    assert len(set(re_runs)) == QUEUED  # each its own run
    failed = {batches[run]["args"]["rerun_of"] for run in re_runs}
    assert len(failed) == 1  # of the one batch that failed, drawn where it was formed
    failed_batch = failed.pop()
    assert formed[failed_batch]["args"]["requests"] == QUEUED and failed_batch not in computes
    # its slot span, to its failure known, marked so (it had none: no end)
    assert batches[failed_batch]["args"]["failed"] is True and batches[failed_batch]["args"]["code"] == 507011
    assert batches[failed_batch]["ts"] + batches[failed_batch]["dur"] <= min(batches[run]["ts"] for run in re_runs)
    for i, run in enumerate(re_runs, start=1):
        assert batches[run]["args"]["rows"] == 1 and run in computes, run
        request = requests[f"r{i}"]
        arrow = arrows[request["args"]["trace_id"]]  # the request's dispatch points at its run's slot
        assert (arrow["pid"], arrow["tid"], arrow["ts"]) == (batches[run]["pid"], batches[run]["tid"],
                                                            batches[run]["ts"])
