"""POST /v2/models/{model}[/versions/{version}]/infer: aiohttp's route handler, the hot path.

Per request: one repository lookup, one cached VersionRecord, the body read under the memory
budget (body.py; the request's lease is held until the answer is built, the answer's part until
it is sent: answer_charge.py; its JSON's parsed size is charged before decoding), decode,
`served.infer` (the batcher), encode, all on the event loop, through the infer path both
transports share (infer_pipeline.py: counted_infer, infer_body); this module adds the HTTP.
Cancellation: when the client goes away aiohttp cancels this handler (handler_cancellation=True)
and the CancelledError raised in `served.infer` removes the request from the queue
(infer_pipeline.py).
"""
from __future__ import annotations

import functools

from aiohttp import StreamReader, web

from ..errors import ServeError
from .answer_charge import AIOHTTP_COPIES, ChargedResponse, answer_charge
from .answer_coding import COMPRESS_MIN_BYTES, answer_coding
from .app_keys import STATE
from .body import MAX_BODY_BYTES, body_limit, read_body, refuse_from_head
from .budget import infer_body_hint
from .codec import HEADER_LENGTH, check_header_length, parse_header_length
from .expect import continue_within
from .infer_pipeline import counted_infer, infer_body
from .json_limits import BINARY_HINT, check_json_size
from .observe import REQUEST_ID_HEADER
from .shedding import stated_id_as_sent

_JSON = "application/json"
_BINARY = "application/octet-stream"
_VARY = {"Vary": "Accept-Encoding"}  # (as /metrics says it)


async def infer(request: web.Request) -> web.Response:
    """The route's handler. Like every route it runs inside the app's middlewares (connection
    tracking, errors to JSON, the API token check when auth_inference is on)."""
    state = request.app[STATE]
    match = request.match_info
    hint = infer_body_hint(HEADER_LENGTH in request.headers)
    with state.budget.lease(hint, match["model"]) as lease:  # until the answer is built
        response = await counted_infer(state, match["model"], match.get("version"),
                                       functools.partial(_infer, request, state, lease),
                                       known_id=request.headers.get(REQUEST_ID_HEADER),
                                       read=functools.partial(_read, request, state, lease),
                                       body_id=functools.partial(_body_id, request, state.json_limits))
        response.charge = answer_charge(lease, AIOHTTP_COPIES * len(response.body))  # until it is sent
        return response


async def expect_body(request: web.Request) -> web.Response | None:
    """The route's `Expect: 100-continue` handler: the API token (when inference needs one), then
    what the request's head alone decides (_refused_by_head), are checked before the client is
    told to send the body. aiohttp runs this before the middlewares, so it does their part for
    what it answers (expect.py): the access check, and telling the connection tracker the
    request is over."""
    return await continue_within(request, _refused_by_head, _counted_refusal)


def _refused_by_head(request: web.Request, state) -> None:
    """Raise what the whole request would be answered, in the order its handler finds it, where
    the head alone decides it: an unknown model or version (404; 503 while it loads), then
    what read_body refuses unread (a Content-Encoding it does not take, the declared size, the
    memory budget: body.refuse_from_head), then a bad Inference-Header-Content-Length, one past
    the body's Content-Length or a JSON part over max_json_bytes (a body inflated is not
    measured from its head: it is told to continue). A client told to continue uploaded its
    whole body only to be refused (a tester's find)."""
    match = request.match_info
    state.repo.get(match["model"], match.get("version"))
    plain = refuse_from_head(request, state.budget, *_body_limit(request, state.config),
                             infer_body_hint(HEADER_LENGTH in request.headers), match["model"])
    header_length = parse_header_length(request.headers.getall(HEADER_LENGTH, ()))
    if header_length and plain and request.content_length is not None:
        check_header_length(header_length, request.content_length)
        check_json_size(header_length, state.json_limits)


async def _counted_refusal(request: web.Request, error: ServeError) -> ServeError:
    """A request refused before its body is sent, counted as the handler counts one (statistics,
    metrics, request log): through counted_infer, so an unknown model is a 404 first. The
    error the request is answered with."""
    async def refuse(rec, trace):
        raise error
    match = request.match_info
    try:
        await counted_infer(request.app[STATE], match["model"], match.get("version"), refuse,
                            known_id=request.headers.get(REQUEST_ID_HEADER))
    except ServeError as e:
        return e
    return error  # (not reached: refuse raises)


def _body_id(request: web.Request, limits) -> str | None:
    """The id the body of a request refused before it is read states (shedding.stated_id_as_sent),
    read from what has arrived already, never waited for (the JSON part of a small body comes
    with its head); a Content-Encoding's body is not JSON text."""
    length = request.content_length
    if length is None or request.headers.get("Content-Encoding", "identity") != "identity":
        return None
    return stated_id_as_sent(length, request.headers.getall(HEADER_LENGTH, ()), limits,
                             functools.partial(_arrived, request.content))


def _arrived(content: StreamReader, size: int) -> bytes | None:
    """The body's first `size` bytes when they have all arrived, else None (not waited for)."""
    if content.total_bytes < size:
        return None
    try:
        return content.read_nowait(size)
    except Exception:  # noqa: BLE001 - the upload's own failure: the line is named by its header
        return None


def _body_limit(request: web.Request, config) -> tuple[int, str]:
    """A body that is all JSON (no Inference-Header-Content-Length) is held to max_json_bytes
    from its Content-Length, before it is read and charged: 16 bodies of 40 MB, to be refused
    once read, held the memory budget meanwhile and other clients got 503."""
    if HEADER_LENGTH in request.headers:
        return config.max_body_bytes, MAX_BODY_BYTES
    return body_limit(config.max_body_bytes, config.max_json_bytes, f"max_json_bytes; {BINARY_HINT}")


async def _read(request: web.Request, state, lease) -> bytes:
    config = state.config
    limit, limit_name = _body_limit(request, config)
    return await read_body(request, lease, limit, config.body_timeout_s, state.body_reads, limit_name,
                           config.max_inflate_ratio, state.stalled_bodies)


async def _infer(request: web.Request, state, lease, rec, trace, body: bytes) -> ChargedResponse:
    header_length = parse_header_length(request.headers.getall(HEADER_LENGTH, ()))
    fallback_id = request.headers.get(REQUEST_ID_HEADER) if trace is not None else None
    payload, json_length = await infer_body(rec, body, header_length, trace, fallback_id, state.images, lease,
                                            pinned="version" in request.match_info)
    # Vary on every answer, compressed or not: its coding follows Accept-Encoding once it is
    # large enough, which a cache between must key it by (RFC 9110 12.5.5; direct.py says it too)
    if json_length is None:
        response = ChargedResponse(body=payload, content_type=_JSON, headers=_VARY)
    else:
        response = ChargedResponse(body=payload, content_type=_BINARY,
                                   headers={HEADER_LENGTH: str(json_length), **_VARY})
    accepted = request.headers.get("Accept-Encoding")
    if len(payload) >= COMPRESS_MIN_BYTES and accepted:
        coding = answer_coding(accepted)
        if coding is not None:
            response.enable_compression(coding)  # deflate is zlib-wrapped
    return response
