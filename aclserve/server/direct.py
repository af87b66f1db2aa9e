"""Plain infer requests answered by the connection guard itself, without aiohttp's request,
response and middleware objects.

Through aiohttp a light request costs the server's core about twice what the infer path
itself costs (its request and response objects, the middleware chain, its writer): measured
side by side on one core, light MLP KServe v2 JSON at 64 clients, 10,657 req/s at 94 us of CPU a
request through aiohttp against 18,542-19,270 at 52-54 us answered here.
So the guard (connections.py), which frames every request anyway (framing.py), answers the
plain ones itself through the same infer path (infer_pipeline.counted_infer and infer_body: the same
decode, batcher, encode, metrics, statistics and errors) and writes the same answer aiohttp
would: status, Content-Type, Content-Length, Inference-Header-Content-Length, Vary, Date, Server.

Plain: POST to an infer path whose names need no decoding, HTTP/1.1, Content-Length (no chunked
body) of at most BODY_BYTES and of max_body_bytes, no Expect, no Content-Encoding, no
Accept-Encoding (aiohttp compresses large answers), and nothing on the connection that aiohttp
has not answered yet (answers keep their order). Everything else goes to aiohttp as before. A
request with `Connection: close` is answered so too, its answer saying `Connection: close`, and
the guard closes the connection after it (said_closing). The guard's work stands in for the
middlewares': the connection is BUSY while the request runs (never timed out nor evicted),
errors become the same JSON answers (error_responses.serve_error_parts; a MemoryError the same
503 as there: host_memory.py), and the API token
check is not needed because nothing is answered here while inference needs a token. Traced and
logged requests are answered here too, observed by the infer path as on aiohttp's (their
X-Request-Id read from the head): when they went through aiohttp, tracing one request in a
thousand sent every request there, at 1.8 times the server's CPU a request. Nothing is answered
here at log_level debug (aiohttp's access log lists every request), nor when the app has
middlewares of its own beyond the server's (a middleware added to the app sees every request:
server.app.direct_answers decides). A head aiohttp's parser would refuse is given up by the
framing (framing.parse_head), so aiohttp answers it 400. `direct_infer: false` in the config
turns it off.

Only a request whose body is in hand is answered here: nothing is held for direct's sake (a
body that did not come with its head in the same read goes to aiohttp; one the early refusal
held back to read it, shedding.py, may be answered here once whole). The body is charged to
the memory budget as aiohttp's path charges it, and the answer stays charged until it is sent
(answer_charge.py); a client that goes away cancels the request (it leaves the queue), as
aiohttp's handler cancellation does.
"""
from __future__ import annotations

import email.utils
import functools
import http
import logging
import time

import orjson
from aiohttp.http import SERVER_SOFTWARE

from ..errors import ServeError
from .answer_charge import DIRECT_COPIES, answer_charge
from .budget import Lease, infer_body_hint
from .codec import HEADER_LENGTH, parse_header_length
from .error_responses import error_body, retry_after_value, serve_error_parts
from .host_memory import host_out_of_memory
from .infer_pipeline import counted_infer, infer_body
from .observe import REQUEST_ID_HEADER
from .plain import guard_may_answer, infer_target
from .request_head import Head
from .shedding import stated_id_as_sent

log = logging.getLogger(__name__)

BODY_BYTES = 64 * 1024  # larger bodies stream through aiohttp, which charges them as they come
_SERVER = SERVER_SOFTWARE.encode()
_JSON = b"application/json"
_BINARY = b"application/octet-stream"
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_VARY = b"Vary: Accept-Encoding\r\n"


class DirectInfer:
    """Owned by the server state; used by the connection guard on the loop. `target(head,
    body_length)` says whether a request is answered here; `answer(...)` renders its answer."""

    def __init__(self, state):  # server.state.ServerState, which owns this
        self._state = state
        self._body_limit = min(BODY_BYTES, state.config.max_body_bytes)
        self.answered = 0  # requests answered here, whatever the status

    def target(self, head: Head, body_length: int) -> tuple[str, str | None] | None:
        """(model, version or None) when this request is answered here, else None."""
        if head.method != b"POST" or body_length > self._body_limit or not guard_may_answer(head, self._state):
            return None
        return head.derived("direct", _plain_target)

    async def answer(self, named: tuple[str, str | None], head: Head, body: bytes | memoryview, transport
                     ) -> tuple[tuple[bytes, bytes], Lease | None]:
        """The HTTP answer (its head, its body) to a request `target` accepted (its body in hand:
        a view of the bytes read, which the codec decodes without copying), and the charge of a
        200's answer, which the caller gives back once the answer is sent (answer_charge.py)."""
        self.answered += 1
        error: Exception
        try:
            return await self._answered(named, head, body)
        except ServeError as e:
            refusal = e
        except MemoryError as e:  # the host short of memory: 503, one WARNING line (host_memory.py)
            refusal = host_out_of_memory(e, f"POST {head.target.decode('latin-1')}")
        except Exception as e:
            refusal, error = None, e
        if refusal is not None:
            try:
                return self._error(refusal, transport), None
            except Exception as inner:  # the answer must go out whatever failed
                error = inner
        log.error("internal error on POST %s", head.target.decode("latin-1"), exc_info=error)
        return _render(500, _JSON, orjson.dumps({"error": "internal error"})), None

    async def _answered(self, named: tuple[str, str | None], head: Head, body: bytes | memoryview
                        ) -> tuple[tuple[bytes, bytes], Lease]:
        """answer()'s 200 and its charge; raises what fails the request."""
        state = self._state
        hint = infer_body_hint(head.header(_HEADER_LENGTH) is not None)
        with state.budget.lease(hint, named[0]) as lease:
            observed = state.observer is not None
            known_id = _request_id(head) if observed else None
            work = functools.partial(self._run, lease, head, body, named[1] is not None, known_id)
            body_id = functools.partial(_body_id, head, body, state.json_limits) if observed else None
            payload, json_length = await counted_infer(state, named[0], named[1], work, known_id=known_id,
                                                       body_id=body_id)
            if json_length is None:
                answer = _render(200, _JSON, payload, vary=True)
            else:
                answer = _render(200, _BINARY, payload, {HEADER_LENGTH: str(json_length)}, vary=True)
            return answer, answer_charge(lease, DIRECT_COPIES * len(payload))

    def _error(self, error: ServeError, transport) -> tuple[bytes, bytes]:
        status, message, wait, headers = serve_error_parts(self._state, error, transport, body_pending=False)
        headers = dict(headers or {})
        if wait:
            headers["Retry-After"] = retry_after_value(wait)
        return _render(status, _JSON, error_body(message), headers)

    async def _run(self, lease, head: Head, body: bytes | memoryview, pinned: bool, known_id: str | None,
                   rec, trace):
        lease.take(len(body), "request body")  # as aiohttp's path charges the body it reads
        header_length = parse_header_length(head.derived("header_length", _header_length_text))
        return await infer_body(rec, body, header_length, trace, known_id, self._state.images, lease, pinned)


def _request_id(head: Head) -> str | None:
    """The X-Request-Id header, decoded as aiohttp decodes header values."""
    value = head.header(_REQUEST_ID, as_sent=True)
    return None if value is None else value.decode("utf-8", "surrogateescape")


def _body_id(head: Head, body: bytes | memoryview, limits) -> str | None:
    """The id a refused request's body states (shedding.stated_id_as_sent: its body is in hand)."""
    return stated_id_as_sent(len(body), head.derived("header_length", _header_length_text), limits,
                             lambda size: body[:size])


def _plain_target(head: Head) -> tuple[str, str | None] | None:
    """What the head alone says (once per Head: framing's memo): its infer target, unless it
    names an encoding (aiohttp's path handles those)."""
    if head.header(b"content-encoding") is None and head.header(b"accept-encoding") is None:
        return infer_target(head.target)
    return None


def _header_length_text(head: Head) -> list[str]:
    """Inference-Header-Content-Length as sent, every occurrence, decoded as aiohttp decodes
    header values."""
    return [value.decode("utf-8", "surrogateescape") for value in head.header_all(_HEADER_LENGTH, as_sent=True)]


def _render(status: int, content_type: bytes, body: bytes, headers: dict | None = None, vary: bool = False
            ) -> tuple[bytes, bytes]:
    """`vary`: the answer says `Vary: Accept-Encoding`, as aiohttp's path says it on an infer answer
    (infer.py: its coding there follows that header)."""
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items()) if headers else b""
    if vary:
        extra += _VARY
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sDate: %s\r\nServer: %s\r\n\r\n"
            % (status, _REASONS[status], content_type, len(body), extra, _date(), _SERVER), body)


def said_closing(answer: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    """`answer` (from DirectInfer.answer) saying `Connection: close`: to a request that said
    so, or made during the drain; its connection closes after it (RFC 9112 9.6)."""
    head, body = answer
    return head[:-2] + b"Connection: close\r\n\r\n", body


_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}
_date_cache = [0, b""]


def _date() -> bytes:
    """The Date header's value, formatted once a second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, email.utils.formatdate(now, usegmt=True).encode()
    return _date_cache[1]
