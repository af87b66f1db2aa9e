"""A traced request whose client left while its batch ran (an HTTP client's timeout, a gRPC
deadline) had its Triton REQUEST_END where the server let go of the request on the event loop,
before its batch's COMPUTE_OUTPUT_START and COMPUTE_END: Triton's trace_summary.py then counted a
request time shorter than its compute, and a negative overhead (found by a tester with
`ACLSERVE_CPU_FAULTS=execute:delay_ms=200` and `curl -m 0.05`). Its rows run all the same, and
Triton releases a request only once the execution holding it ends: REQUEST_END is now at or after
its COMPUTE_END. The Chrome trace drew its execute phase to the client's leaving, inside a batch
that ran on: it is drawn to the batch's end, the request with it, and a "client left" instant
marks where the client went.
Real server on a real port; an HTTP client closing its connection and a gRPC client cancelling its
call (the server sees a timeout or a deadline so) while the model's only slot holds their run (an
injected fault); the trace file the server writes at shutdown."""
from __future__ import annotations

import asyncio
import json
import socket
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, free_port, post_status, server_config

from .hostile import wait_for
from .test_server_statistics import _failures


def _body(request_id: str) -> bytes:
    return json.dumps({"id": request_id, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                                     "data": [1.0] * 16}]}).encode()


def _http_leaves(url: str, held: faults.Fault) -> None:
    """An HTTP client that closes its connection once its run is held (as one timing out does)."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as client:
        body = _body("http-left")
        client.sendall(b"POST /v2/models/double/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body))
        assert held.entered.wait(60)


def _grpc_leaves(url: str, held: faults.Fault) -> None:
    """A gRPC client that cancels its call once its run is held (as one past its deadline does)."""
    x = grpcclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with grpcclient.InferenceServerClient(url) as client:
        call = client.async_infer("double", [x], lambda result, error: None, request_id="grpc-left")
        assert held.entered.wait(60)
        call.cancel()


def _clients_left(models_dir, tmp_path, fmt: str):
    """`http-left` and `grpc-left` traced into `fmt`, each leaving while its run holds the model's
    only slot; each run let go once the server saw its client leave, and seen to end (a request
    after it is answered: the slot's batches end in order). The file's JSON."""
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": fmt}
    config = server_config(models_dir, trace=trace, trace_dir=str(tmp_path / "traces"), grpc_port=free_port(),
                           model_defaults={"slots": 1, "execution_timeout_ms": 60_000})  # (held meanwhile)
    srv = ServerThread(config).start()
    gates = []
    try:
        for left, (leaves, url) in enumerate(((_http_leaves, srv.url),
                                              (_grpc_leaves, f"127.0.0.1:{config.grpc_port}")), 1):
            gates.append(threading.Event())
            leaves(url, faults.inject("execute", nth=1, hold=gates[-1]))
            asyncio.run(wait_for(lambda: _failures(srv.url, "Cancelled") == left, limit_s=60))
            gates[-1].set()
            assert post_status(srv.url, "/v2/models/double/infer", _body(f"after-{left}")) == 200
    finally:
        for gate in gates:
            gate.set()
        srv.close()
    return json.loads((tmp_path / "trace.json").read_bytes())


def test_a_request_whose_client_left_during_its_batch_ends_after_its_compute_in_triton_traces(
        double_dir, tmp_path, clean_faults):
    entries = _clients_left(double_dir, tmp_path, "triton")
    ids = {e["request_id"]: e["id"] for e in entries if "model_name" in e}
    for rid in ("http-left", "grpc-left"):
        stamps = {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
                  if e["id"] == ids[rid] and "timestamps" in e}
        assert stamps["COMPUTE_START"] <= stamps["COMPUTE_OUTPUT_START"] <= stamps["COMPUTE_END"] \
            <= stamps["REQUEST_END"], (rid, stamps)
        assert not any("_SEND_" in name for name in stamps), (rid, stamps)  # no answer written
        # trace_summary.py's overhead: the request's handler time less its queue and compute
        handler = stamps["REQUEST_END"] - stamps["REQUEST_START"]
        queue = stamps["COMPUTE_START"] - stamps["QUEUE_START"]
        compute = stamps["COMPUTE_END"] - stamps["COMPUTE_START"]
        assert handler - queue - compute >= 0, (rid, stamps)


def test_a_request_whose_client_left_during_its_batch_is_drawn_to_its_end_in_chrome_traces(
        double_dir, tmp_path, clean_faults):
    events = _clients_left(double_dir, tmp_path, "chrome")["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    batches = {e["args"]["batch"]: e for e in spans if e["name"].startswith("batch #")}
    for rid in ("http-left", "grpc-left"):
        request = next(e for e in spans if e["name"] == f"request {rid}")
        assert request["args"]["status"] == 499
        end = request["ts"] + request["dur"]
        lane = [e for e in events if e["ph"] in ("X", "i") and e["tid"] == request["tid"]
                and request["ts"] <= e["ts"] <= end]
        execute = next(e for e in lane if e["name"] == "execute")
        left = next(e for e in lane if e["name"] == "client left")
        batch = batches[request["args"]["batch"]]
        batch_end = batch["ts"] + batch["dur"]
        assert left["ts"] < batch_end  # it left while its batch ran ...
        # ... and its execute phase, inside the request, runs to that batch's end (microseconds, as floats)
        assert execute["ts"] + execute["dur"] == pytest.approx(batch_end, abs=0.002)
        assert execute["ts"] + execute["dur"] <= end + 0.002
