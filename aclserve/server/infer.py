"""POST /v2/models/{model}[/versions/{version}]/infer: the hot path.

Per request: one repository lookup, one cached VersionRecord, the body read under the memory
budget (body.py; the request's lease is held until the answer is built, and its JSON's parsed
size is charged before decoding), decode, `served.infer` (the batcher), encode, all on the
event loop. JSON is not moved to a worker thread: orjson and the
array conversion hold the interpreter lock, so the loop could not run meanwhile anyway
(measured: medium-CNN JSON bodies at 16 clients, 611 req/s inline against 615 with the hop and
the same CPU per request; the longest loop stall while a 1.9 MB body decodes, 12-20 ms inline
against 15 ms in a thread). Cancellation: when the client goes away aiohttp cancels this
handler (handler_cancellation=True) and the CancelledError raised in `served.infer` removes the
request from the queue.
"""
from __future__ import annotations

import asyncio
import functools
import time

from aiohttp import web

from ..errors import ServeError
from .app_keys import STATE
from .body import read_body
from .budget import json_tensor_estimate
from .codec import HEADER_LENGTH, decode_request, parse_header_length
from .encode import encode_response

_JSON = "application/json"
_BINARY = "application/octet-stream"
COMPRESS_MIN_BYTES = 1024  # smaller answers gain nothing from compression and cost CPU


async def infer(request: web.Request) -> web.Response:
    """The routed handler (the fast path in fastpath.py calls handle_infer directly)."""
    match = request.match_info
    return await handle_infer(request, request.app[STATE], match["model"], match.get("version"))


async def handle_infer(request: web.Request, state, model: str, version: str | None) -> web.Response:
    if state.auth.inference:
        state.auth.check(request)
    with state.budget.lease() as lease:  # held until the answer is built
        return await counted_infer(state, model, version, functools.partial(_infer, request, state, lease))


async def counted_infer(state, model: str, version: str | None, work):
    """Count one infer request in flight (refused when shutting down), resolve the serving
    version, await `work(record)` and record the outcome in the version's metrics. The one
    infer path of both transports: HTTP passes its decode/encode, gRPC its own."""
    start = time.perf_counter()
    state.enter()  # 503 / UNAVAILABLE when shutting down
    try:
        served = state.repo.get(model, version)
        rec = state.record(served)
        try:
            response = await work(rec)
        except ServeError as e:
            rec.metrics.request_failed(type(e).__name__, time.perf_counter() - start)
            raise
        except asyncio.CancelledError:
            rec.metrics.request_failed("Cancelled", time.perf_counter() - start)
            raise
        rec.metrics.request_ok(time.perf_counter() - start)
        return response
    finally:
        state.leave()


async def _infer(request: web.Request, state, lease, rec) -> web.Response:
    config = state.config
    body = await read_body(request, lease, config.max_body_bytes, config.body_timeout_s)
    header_length = parse_header_length(request.headers.get(HEADER_LENGTH))
    json_size = min(len(body) if header_length is None else header_length, len(body))
    # what parsing it may hold at most: one value per 2 bytes, and no more than the codec allows
    values = min(json_size // 2 + 1, rec.signature.json_limits.max_elements)
    lease.take(json_tensor_estimate(json_size, values), "decoding its JSON")
    req = decode_request(body, header_length, rec.signature)
    if rec.images is not None:  # decode the images in the pool: the device keeps computing meanwhile
        await state.images.prepare(rec.images, req.inputs)
    result = await rec.served.infer(req.inputs, req.rows, priority=req.priority, timeout_us=req.timeout_us)
    payload, json_length = encode_response(rec.name, rec.version, req, result.outputs, rec.signature,
                                           rec.batched)
    if json_length is None:
        response = web.Response(body=payload, content_type=_JSON)
    else:
        response = web.Response(body=payload, content_type=_BINARY,
                                headers={HEADER_LENGTH: str(json_length)})
    if len(payload) >= COMPRESS_MIN_BYTES and "Accept-Encoding" in request.headers:
        response.enable_compression()  # honours Accept-Encoding; deflate is zlib-wrapped
    return response
