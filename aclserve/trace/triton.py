"""Traces -> Triton's trace JSON (docs/user_guide/trace.md of Triton), for tools written against it
(Triton's trace_summary.py, dashboards).

Per request: one object with id, model_name, model_version and request_id (left out when the
request has none, as Triton leaves it out when empty; parent_id, which Triton writes only for a
child trace (an ensemble's step), is never written: a request here has no parent), then one
object per timestamp {"id", "timestamps": [{"name", "ns"}]}. Names map as Triton's do:
HTTP_RECV_START/END (GRPC_WAITREAD_START/END over gRPC) = arrival and body read, REQUEST_START
= decoded, QUEUE_START = enqueued, COMPUTE_START = the batch's launch on its instance (where the
request's queue time ends in the statistics, the request log and /metrics too),
COMPUTE_INPUT_END = copy-in done, COMPUTE_OUTPUT_START = execution done, COMPUTE_END = the
batch's result, REQUEST_END = the request back from its queue or batch on the event loop whatever
the outcome (its outputs, its error, a timeout in the queue, cancelled: Triton stamps it when it
releases a request, and its trace_summary.py counts a request with REQUEST_START and REQUEST_END
only); a request whose client left (an HTTP client's timeout, a gRPC deadline) once its batch was
formed is released with that batch's end, at or after its COMPUTE_END (its rows ran all the same,
and Triton releases a request only once the execution holding it ends: a REQUEST_END before
COMPUTE_END made trace_summary.py's overhead negative). A trace written while that batch still
ran has at most its COMPUTE_START, and its REQUEST_END no earlier. HTTP_SEND_START/END
(GRPC_SEND_*) = the answer encoded / handed to the transport; an error's answer, made after the
trace ends, has both where it is handed over, and a request whose client went away (no answer
written) has neither. Values are perf_counter_ns (CLOCK_MONOTONIC, the
clock Triton uses as well). A failed run (a request answered with its error) has its
COMPUTE_OUTPUT_START and COMPUTE_END where its failure was known, as Triton's backends stamp a
failed execution's (ONNX Runtime's: compute_end_ns and exec_end_ns after the run that failed), and
no COMPUTE_INPUT_END unless its copy-in was timed (its device times are not read). A request
re-run alone after its batch failed (runtime/isolation.py) has the COMPUTE_* of the run that
answered it; its failed run's are not written: one of each name a request, as tools written
against Triton's format (its trace_summary.py) key them by name, and as a batch retried whole
keeps its last attempt.
"""
from __future__ import annotations

import orjson

from .records import CLIENT_GONE, RequestTrace


def render(traces: list[RequestTrace]) -> bytes:
    return orjson.dumps(entries(traces))


def entries(traces: list[RequestTrace]) -> list[dict]:
    out: list[dict] = []
    for t in sorted(traces, key=lambda t: t.id):
        version = int(t.version) if str(t.version).isdigit() else t.version
        head = {"id": t.id, "model_name": t.model, "model_version": version}
        if t.request_id:
            head["request_id"] = t.request_id
        out.append(head)
        for name, ns in _timestamps(t):
            if ns:
                out.append({"id": t.id, "timestamps": [{"name": name, "ns": ns}]})
    return out


def _timestamps(t: RequestTrace) -> list[tuple[str, int]]:
    wire = "GRPC" if t.protocol == "grpc" else "HTTP"
    recv = ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END") if wire == "GRPC" else ("HTTP_RECV_START", "HTTP_RECV_END")
    batch = t.batch
    compute_start = input_end = output_start = compute_end = 0
    if batch is not None:
        compute_start = batch.launched_ns
        # its end first: a batch still running (its client left) has its device times being written
        compute_end = batch.done_ns
        if compute_end:
            input_end = batch.h2d[1] if batch.h2d else (batch.compute[0] if batch.compute else 0)
            output_start = batch.compute[1] if batch.compute else 0
        if batch.error is not None and not output_start:  # a failed run ended when its failure was known
            output_start = compute_end
        # in the order Triton's format promises (its trace_summary.py subtracts them): the device
        # times are placed on the host's clock from anchors (runtime/device_clock.py), which a tester
        # saw put a copy-in's end up to 1.4 ms before its batch's launch with runs delayed by faults
        if input_end:
            input_end = min(max(input_end, compute_start), compute_end or input_end)
        if output_start:
            output_start = min(max(output_start, input_end or compute_start), compute_end or output_start)
    send_start = send_end = 0
    if t.status != CLIENT_GONE:  # (an error's answer is made after its trace ends: both where it is handed over)
        send_start, send_end = t.encoded_ns or t.end_ns, t.end_ns
    return [(recv[0], t.arrival_ns), (recv[1], t.received_ns), ("REQUEST_START", t.decoded_ns),
            ("QUEUE_START", t.enqueued_ns), ("COMPUTE_START", compute_start), ("COMPUTE_INPUT_END", input_end),
            ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", compute_end), ("REQUEST_END", t.held_ns),
            (f"{wire}_SEND_START", send_start), (f"{wire}_SEND_END", send_end)]
