"""A traced request released without its outputs had no REQUEST_END: it was stamped with the
result only, so a request answered with its error (a failed run, a timeout in the queue) or
whose client went away lacked it, and one answered with its error lacked HTTP_SEND_START too
(GRPC_SEND_START over gRPC). Triton stamps REQUEST_END when it releases a request whatever the
outcome (InferenceRequest::Release), and its trace_summary.py counts only requests with both
REQUEST_START and REQUEST_END. In the Chrome trace such a request now has its execute phase from
its batch's launch to its release, or its queue drawn to its release when it left it unbatched.
Real server on a real port, HTTP and gRPC, an execute fault injected in the CPU runtime with
retry off, a queue deadline (the request's `timeout` parameter) passing while the model's only
slot is held, a client gone while its run is held; the trace file the server writes at shutdown."""
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

FAULT = 507011  # an AI Core exception (the CPU runtime's default injected code)
QUEUE_TIMEOUT_US = 1000  # the late requests' own queue deadline: it passes while the slot is held


def _body(request_id: str, **parameters) -> bytes:
    body = {"id": request_id, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


def _http(url: str, request_id: str, **parameters) -> int:
    """The HTTP status of one infer request."""
    return post_status(url, "/v2/models/double/infer", _body(request_id, **parameters))


def _grpc(url: str, request_id: str, timeout_us: int | None = None) -> str:
    """The gRPC status of one ModelInfer call ("OK" or the failure's)."""
    x = grpcclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with grpcclient.InferenceServerClient(url) as client:
        try:
            client.infer("double", [x], request_id=request_id, timeout=timeout_us, client_timeout=60)
        except grpcclient.InferenceServerException as e:
            return e.status()
    return "OK"


def _outcomes_traced(models_dir, tmp_path, fmt: str):
    """Every request traced into `fmt`: `failed` and `grpc-failed` answered with their run's
    fault; `gone` held in the model's only slot, `late` and `grpc-late` timing out in the queue
    behind it, then `gone`'s client leaving. The file's JSON."""
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": fmt}
    config = server_config(models_dir, trace=trace, trace_dir=str(tmp_path / "traces"), grpc_port=free_port(),
                           model_defaults={"retry": False, "slots": 1})
    srv = ServerThread(config).start()
    grpc_url = f"127.0.0.1:{config.grpc_port}"
    gate = threading.Event()
    try:
        faults.inject("execute", nth=1, code=FAULT)
        assert _http(srv.url, "failed") == 500
        faults.inject("execute", nth=1, code=FAULT)
        assert _grpc(grpc_url, "grpc-failed") == "StatusCode.INTERNAL"
        held = faults.inject("execute", nth=1, hold=gate, code=0)
        host, port = srv.url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as gone:
            body = _body("gone")
            gone.sendall(b"POST /v2/models/double/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            assert held.entered.wait(60)  # its run holds the only slot: the next requests queue
            assert _http(srv.url, "late", timeout=QUEUE_TIMEOUT_US) == 503
            assert _grpc(grpc_url, "grpc-late", QUEUE_TIMEOUT_US) == "StatusCode.UNAVAILABLE"
        asyncio.run(wait_for(lambda: _failures(srv.url, "Cancelled") == 1, limit_s=60))  # the server saw it go
    finally:
        gate.set()
        srv.close()
    return json.loads((tmp_path / "trace.json").read_bytes())


def test_requests_released_without_outputs_have_their_request_end_in_triton_traces(double_dir, tmp_path,
                                                                                   clean_faults):
    entries = _outcomes_traced(double_dir, tmp_path, "triton")
    ids = {e["request_id"]: e["id"] for e in entries if "model_name" in e}
    stamps = {rid: {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
                    if e["id"] == tid and "timestamps" in e} for rid, tid in ids.items()}
    for rid, wire in (("failed", "HTTP"), ("grpc-failed", "GRPC")):  # answered with their run's fault
        assert list(stamps[rid])[-4:] == ["COMPUTE_END", "REQUEST_END", f"{wire}_SEND_START", f"{wire}_SEND_END"], \
            (rid, stamps[rid])
        assert list(stamps[rid].values()) == sorted(stamps[rid].values()), (rid, stamps[rid])
    for rid, recv, wire in (("late", "HTTP_RECV", "HTTP"), ("grpc-late", "GRPC_WAITREAD", "GRPC")):  # timed out
        assert list(stamps[rid]) == [f"{recv}_START", f"{recv}_END", "REQUEST_START", "QUEUE_START", "REQUEST_END",
                                     f"{wire}_SEND_START", f"{wire}_SEND_END"], (rid, stamps[rid])
        assert list(stamps[rid].values()) == sorted(stamps[rid].values()), (rid, stamps[rid])
    gone = stamps["gone"]  # released when its client went away; no answer written, so no send stamps
    assert "REQUEST_END" in gone and not any(name.startswith("HTTP_SEND") for name in gone), gone
    assert gone["QUEUE_START"] <= gone["COMPUTE_START"] <= gone["REQUEST_END"], gone


def test_requests_released_without_outputs_are_drawn_to_their_release_in_chrome_traces(double_dir, tmp_path,
                                                                                       clean_faults):
    events = _outcomes_traced(double_dir, tmp_path, "chrome")["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    requests = {e["args"].get("request_id"): e for e in spans if e["name"].startswith("request ")}
    batches = {e["args"]["batch"]: e for e in spans if e["name"].startswith("batch #")}

    def phase(rid: str, name: str) -> dict | None:
        request = requests[rid]
        found = [e for e in spans if e["name"] == name and e["tid"] == request["tid"]
                 and request["ts"] <= e["ts"] <= request["ts"] + request["dur"]]
        assert len(found) <= 1, (rid, name, found)
        return found[0] if found else None

    for rid in ("failed", "grpc-failed", "gone"):  # each had a batch launched: executing until its release
        request, execute = requests[rid], phase(rid, "execute")
        assert execute is not None, rid
        slot = batches[request["args"]["batch"]]
        assert execute["ts"] == pytest.approx(slot["ts"], abs=0.002)  # from its launch (microseconds, as floats)
        # (gone's ends with its request, at its batch's end: the same ns, summed as floats in microseconds)
        assert execute["ts"] + execute["dur"] <= request["ts"] + request["dur"] + 0.002, rid
    for rid in ("late", "grpc-late"):  # left the queue unbatched: its queue ends at its release, before its end
        request, queue = requests[rid], phase(rid, "queue")
        assert request["args"]["status"] == 503 and phase(rid, "execute") is None
        assert queue["ts"] + queue["dur"] < request["ts"] + request["dur"], (queue, request)
