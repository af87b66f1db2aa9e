"""A traced batch whose run failed had no end: the completion thread stamped `done_ns` on a
success only, so the Chrome trace drew no slot span for any failed batch, and a traced request
answered 500 had COMPUTE_START alone in Triton's format (Triton's backends stamp a failed
execution's COMPUTE_OUTPUT_START and COMPUTE_END too: ONNX Runtime's reports compute_end_ns and
exec_end_ns after the run that failed). Real server on a real port, an execute fault injected in
the CPU runtime, retry off: the request is answered with its error; the trace file the server
writes at shutdown."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, server_config

BODY = json.dumps({"id": "doomed", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                                "data": [1.0] * 16}]}).encode()
FAULT = 507011  # an AI Core exception (the CPU runtime's default injected code)


def _failed_request_traced(models_dir, tmp_path, fmt: str):
    """Every request traced into `fmt`; one request whose run faults, answered 500. The file's JSON."""
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": fmt}
    config = server_config(models_dir, trace=trace, trace_dir=str(tmp_path / "traces"),
                           model_defaults={"retry": False})
    srv = ServerThread(config).start()
    try:
        faults.inject("execute", nth=1, code=FAULT)
        request = urllib.request.Request(f"http://{srv.url}/v2/models/double/infer", data=BODY, method="POST")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=60)
        assert answer.value.code == 500
        answer.value.close()
    finally:
        srv.close()
    return json.loads((tmp_path / "trace.json").read_bytes())


def test_a_request_of_a_failed_run_has_its_compute_end_in_triton_traces(double_dir, tmp_path, clean_faults):
    entries = _failed_request_traced(double_dir, tmp_path, "triton")
    [head] = [e for e in entries if e.get("request_id") == "doomed"]
    stamps = {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
              if e["id"] == head["id"] and "timestamps" in e}
    compute = [name for name in stamps if name.startswith("COMPUTE_")]
    # (no COMPUTE_INPUT_END: the failed run's copy-in is not timed)
    assert compute == ["COMPUTE_START", "COMPUTE_OUTPUT_START", "COMPUTE_END"], stamps
    assert stamps["COMPUTE_OUTPUT_START"] == stamps["COMPUTE_END"]  # where its failure was known
    assert list(stamps.values()) == sorted(stamps.values()), stamps  # in order, up to the answer sent
    assert list(stamps)[-1] == "HTTP_SEND_END", stamps


def test_a_failed_run_has_its_slot_span_marked_failed_in_chrome_traces(double_dir, tmp_path, clean_faults):
    events = _failed_request_traced(double_dir, tmp_path, "chrome")["traceEvents"]
    [request] = [e for e in events if e["ph"] == "X" and e["name"] == "request doomed"]
    assert request["args"]["status"] == 500
    batch_id = request["args"]["batch"]
    [slot] = [e for e in events if e["ph"] == "X" and e["name"].startswith(f"batch #{batch_id} ")]
    assert slot["name"].endswith(" failed"), slot
    assert slot["args"]["failed"] is True
    assert (slot["args"]["error"], slot["args"]["code"]) == ("ExecutionFailed", FAULT)
    assert slot["dur"] > 0
    # from its launch, where the request's queue ends, to before the request's answer
    [queue] = [e for e in events if e["ph"] == "X" and e["name"] == "queue" and e["tid"] == request["tid"]]
    assert queue["ts"] + queue["dur"] == pytest.approx(slot["ts"], abs=0.002)  # (microseconds, as floats)
    assert slot["ts"] + slot["dur"] <= request["ts"] + request["dur"]
