"""The infer path both transports share, with neither's request objects: counted_infer (the
in-flight count, the version lookup, the outcome in the metrics, statistics, trace and request
log), infer_body (a KServe v2 HTTP body decoded under the memory budget, run and encoded: for
aiohttp's handler, infer.py, the connection guard's direct.py and `aclserve profile`), run_decoded
(a decoded request queued and its answer rendered: where gRPC, grpc_service.py, joins) and
charge_decoding. It imports neither aiohttp nor grpc itself (.importlinter's contract says so),
though three server modules it reaches do: body.py, auth.py and framing.py, where what both
transports share lives beside their aiohttp code (allowed there, named in the contract).

All on the event loop. JSON is not moved to a worker
thread: orjson and the array conversion hold the interpreter lock, so the loop could not run meanwhile anyway
(measured: medium-CNN JSON bodies at 16 clients, 611 req/s inline against 615 with the hop and
the same CPU per request; the longest loop stall while a 1.9 MB body decodes, 12-20 ms inline
against 15 ms in a thread). A large answer's JSON is written a slice of values at a time,
the loop given its turns between slices (json_slices.py: 92 MB of JSON held it 0.4-1.3 s).
Cancellation: the CancelledError raised in `served.infer` when a client goes away removes the
request from the queue (raised while its answer is written, the request counts as answered,
as its statistics count it).

Observation (observe.py): when tracing or the request log is on, `counted_infer` asks the
Observer for the request's RequestTrace and the transport marks its phases on it; otherwise
the only cost is one attribute check.
"""
from __future__ import annotations

import asyncio
import functools
import time
from types import CoroutineType

from ..errors import InvalidInput, MalformedRequest, ServeError
from ..scheduling import answered_before_cancel, mark_answered
from ..trace import CLIENT_GONE, now_ns
from .answer_size import answer_bytes, answer_hint
from .budget import json_decoding_hint, json_tensor_estimate
from .codec import decode_request
from .encode import encode_response
from .failure_reasons import CANCELLED, INTERNAL_ERROR, failure_reason
from .host_memory import host_out_of_memory
from .http_errors import http_status
from .json_limits import value_bound
from .json_tensors import NOT_JSON
from .not_json import what_it_is
from .observe import CancelledBecause, request_id
from .shedding import refuse_undecoded, stated_id


CLIENT_WENT = "cancelled: the client went away"


async def counted_infer(state, model: str, version: str | None, work, protocol: str = "http",
                        known_id: str | None = None, read=None, body_id=None, when_sent=None):
    """Count one infer request in flight (refused when shutting down), resolve the serving
    version, await `work(record, trace)` and record the outcome in the version's metrics (and,
    when observed, its trace and request log line; `known_id`: the request's id as far as it is
    known before its body is decoded, for the line of one refused before that). The one infer
    path of both transports:
    HTTP passes its decode/encode, gRPC its own. `trace` is a RequestTrace or None.
    `read()`: aiohttp's path, whose body is still to come, reads it here, and `work(record,
    trace, body)` gets it. The duration histogram starts once the body is in hand, as on the
    paths that have it before they come here (the guard's, gRPC's): a client's slow upload is
    not time in the server. The statistics' `fail`, traces and the request log count from here.
    A request refused as invalid by a version retired meanwhile (its body still arriving during
    a reload, say) is answered 503 to send it again when the version serving now may take it
    (repository/successor.py).
    `body_id()`: over HTTP, the id the request's body states, when it is small enough to be read for
    it (shedding.stated_id's rule), else None; asked only for the log line of a request refused
    before its version is found, which is named by it first, as any other line is.
    `when_sent` (observe.EndWhenSent: a gRPC stream's) holds the trace's and log line's end of
    an answered request until its answer leaves; one cancelled is ended at once (no answer)."""
    start = time.perf_counter_ns()
    try:
        state.enter()  # 503 / UNAVAILABLE when shutting down
    except ServeError as e:
        _refused(state, model, version, protocol, start, e, known_id, body_id, when_sent)
        raise
    try:
        try:
            served = state.repo.get(model, version)
        except ServeError as e:  # no such model or version, or none serving: logged by the name asked for
            _refused(state, model, version, protocol, start, e, known_id, body_id, when_sent)
            raise
        rec = state.record(served)
        observer = state.observer
        trace = observer.begin(rec.name, rec.version, protocol, start) if observer is not None else None
        if trace is not None and known_id is not None:  # named even when refused before its body is read
            trace.request_id = request_id(known_id)
        served_from = start  # the duration histogram's start
        try:
            try:
                if read is None:
                    response = await work(rec, trace)
                else:
                    body = await read()
                    served_from = time.perf_counter_ns()
                    response = await work(rec, trace, body)
            except InvalidInput as invalid:  # checked against `served`: replaced meanwhile, it may be sent again
                if isinstance(invalid, MalformedRequest):  # (refused whatever model: reviewer r21)
                    raise
                answer = served.invalid_since_retired(invalid, pinned=version is not None)
                if answer is invalid:
                    raise
                raise answer from None
            except MemoryError as short:  # the host's memory, not a fault here: 503 (host_memory.py)
                raise host_out_of_memory(short, f"a request to model {rec.name}") from None
        except ServeError as e:
            rec.request_failed(failure_reason(e), time.perf_counter_ns() - start)
            if trace is not None:
                _end(functools.partial(observer.end, trace), http_status(e), e.message, when_sent)
            raise
        except asyncio.CancelledError as e:
            if answered_before_cancel(e):  # its outputs had come: a success, as the model's statistics count it
                rec.metrics.request_ok((time.perf_counter_ns() - served_from) / 1e9)
            else:
                rec.request_failed(CANCELLED, time.perf_counter_ns() - start)
            if trace is not None:  # (why, when the server cancelled it: its message, grpc_stream.py)
                why = e.args[0] if e.args and isinstance(e.args[0], CancelledBecause) else CLIENT_WENT
                observer.end(trace, CLIENT_GONE, why)
            raise
        except Exception:
            rec.request_failed(INTERNAL_ERROR, time.perf_counter_ns() - start)
            if trace is not None:
                _end(functools.partial(observer.end, trace), 500, "internal error", when_sent)
            raise
        rec.metrics.request_ok((time.perf_counter_ns() - served_from) / 1e9)
        if trace is not None:
            _end(functools.partial(observer.end, trace), 200, None, when_sent)
        return response
    finally:
        state.leave()


def _end(end, status: int, error: str | None, when_sent) -> None:
    """`end(status, error)` now, or once the answer leaves (`when_sent`)."""
    if when_sent is None:
        end(status, error)
    else:
        when_sent.hold(end, status, error)


def _refused(state, model: str, version: str | None, protocol: str, start: int, error: ServeError,
             known_id: str | None, body_id, when_sent) -> None:
    observer = state.observer
    if observer is not None and observer.log_requests:  # (only its log line names it)
        stated = body_id() if body_id is not None else None
        end = functools.partial(observer.refused, model, version, protocol, start, known_id=stated or known_id)
        _end(end, http_status(error), error.message, when_sent)


async def infer_body(rec, body: bytes, header_length: int | None, trace=None, fallback_id: str | None = None,
                     images=None, lease=None, pinned: bool = False):
    """Decode a KServe v2 body, charge its answer to `lease` (answer_size.py), run it, encode
    the answer: (payload, json_length). With a lease, a body its level has no room for is refused
    undecoded (shedding.refuse_undecoded; observed, it is named by the id its body states when
    shedding.stated_id reads one, else its header's), and what decoding may hold is charged first
    (charge_decoding), given back once decoded but for the decoded tensors (the parse's objects
    are gone by then). `pinned`: the request named its version (run_decoded). The work of both
    HTTP paths without the HTTP (`aclserve profile` drives it in-process, without a lease)."""
    if trace is not None:
        trace.received_ns = now_ns()
        trace.request_id = request_id(fallback_id)  # named even when the body is refused
    decoding = 0
    if lease is not None:
        rec.served.batcher.request_read()  # (HTTP: the early refusals count it until here)
        try:
            refuse_undecoded(rec.served.batcher, body, header_length)
        except ServeError:
            if trace is not None:  # handed to its model and released at once: REQUEST_START/END as gRPC's
                trace.decoded_ns = trace.released_ns = now_ns()
                trace.request_id = request_id(stated_id(body, header_length, rec.signature.json_limits)
                                              or fallback_id)
            raise
        decoding = charge_decoding(lease, rec, body, header_length)
    try:
        req = decode_request(body, header_length, rec.signature)
    except ServeError as e:
        if trace is not None and e.request_id:  # its own id, when the body said it
            trace.request_id = request_id(e.request_id)
        if header_length is None and e.message.startswith(NOT_JSON):  # a picture or a form, perhaps
            instead = what_it_is(body, rec.signature.inputs)
            if instead is not None:
                raise InvalidInput(f"{NOT_JSON}{instead}") from None
        raise
    if decoding:
        lease.drop(max(0, decoding - sum(_held_bytes(array) for array in req.inputs.values())))
    if lease is not None:  # the HTTP body joins binary outputs behind the JSON: one copy more
        lease.take(answer_bytes(rec.signature, req, binary_copies=1, json_outputs=True), "its answer",
                   lambda: answer_hint(rec.signature, req, json_outputs=True))
    return await run_decoded(rec, req, trace, encode_response, images, pinned, lease)


async def run_decoded(rec, req, trace, encode, images=None, pinned: bool = False, lease=None):
    """Queue a decoded request (codec.InferRequest), wait for its outputs and render them with
    `encode(name, version, req, outputs, signature, batched)` (the answer, or a coroutine of it);
    both transports end here. With a trace, marks decoded / released (whatever the outcome) /
    result / encoded (the request's KServe id wins over a header's).
    `pinned`: the request named its version, which a reload then never hands to another
    (repository/served.py).
    `images`: the server's ImageDecoding, which decodes an image input's pictures in its pool,
    their peak memory charged to `lease` meanwhile; the request's queue deadline counts its wait
    for a decode thread, as it counts the queue's (Batcher.deadline_s)."""
    waited_ns = 0
    if images is not None and rec.images is not None:  # the device keeps computing meanwhile
        if trace is not None and images.off_loop:
            trace.pictures_ns = now_ns()
        deadline_s = rec.served.batcher.deadline_s(req.priority, req.timeout_us)
        waited_ns = await images.prepare(rec.images, req.inputs, lease, deadline_s)
    if trace is not None:
        trace.decoded_ns = now_ns()
        if req.id:
            trace.request_id = request_id(req.id)
    try:
        result = await rec.served.infer(req.inputs, req.rows, priority=req.priority, timeout_us=req.timeout_us,
                                        trace=trace if trace is not None and trace.sampled else None, pinned=pinned,
                                        waited_ns=waited_ns)
    finally:  # released whatever the outcome, as Triton stamps REQUEST_END when it releases a request
        if trace is not None:
            trace.released_ns = now_ns()
    if trace is not None:
        trace.result_ns = trace.encode_start_ns = trace.released_ns
        trace.queue_ns, trace.compute_ns = result.queue_ns, result.compute_ns
    # (a reload may have handed it to another version: the answer names the one that ran it)
    encoded = encode(rec.name, result.version or rec.version, req, result.outputs, rec.signature, rec.batched)
    if type(encoded) is CoroutineType:  # HTTP's large JSON, written with the loop's turns between slices
        try:
            encoded = await encoded
        except asyncio.CancelledError as cancelled:  # its client went: answered, as its statistics count it
            mark_answered(cancelled)
            raise
    if trace is not None:
        trace.encoded_ns = now_ns()
    return encoded


def _held_bytes(value) -> int:
    """Memory a decoded input holds: an array's elements (and a BYTES array's strings besides),
    or an image input's encoded pictures (a list)."""
    if isinstance(value, list):
        return sum(len(item) for item in value)
    if value.dtype.kind == "O":
        return value.nbytes + sum(len(item) for item in value.flat)
    return value.nbytes


def charge_decoding(lease, rec, body, header_length: int | None) -> int:
    """Charge what decoding the body's JSON may hold at most, before it is decoded (infer_body,
    for both HTTP paths): one value per 2 bytes of its text, and no more than the codec
    allows. When that would not fit, the values the text can hold, counted from its separators
    (json_limits.value_bound, about 0.2 ms per MB: so only then): numbers written with their
    digits hold one value per 8-20 bytes, and a 3x96x96 image's 570 KB of JSON was charged
    17.4 MiB for the 2.3 it can take. Returns the charge (infer_body gives it back once decoded:
    it only has to fit while the one request is parsed). Its 413 advises the binary tensor
    extension where the JSON carries tensor data, whatever the body's framing (json_decoding_hint)."""
    json_size = min(len(body) if header_length is None else header_length, len(body))
    values = min(json_size // 2 + 1, rec.signature.json_limits.max_elements)
    estimate = json_tensor_estimate(json_size, values)
    if not lease.fits(estimate):  # (separators inside strings count too: never above the first)
        text = body if json_size == len(body) else memoryview(body)[:json_size]
        estimate = json_tensor_estimate(json_size, min(value_bound(text), values))
    lease.take(estimate, "decoding its JSON",
               lambda: json_decoding_hint(memoryview(body)[:json_size], header_length is None))
    return estimate
