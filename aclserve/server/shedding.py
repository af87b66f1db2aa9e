"""Infer requests refused before aiohttp parses them, while their queue is full.

Under overload most requests are refused, and through aiohttp a refusal costs the loop's core
about 0.1 ms (its request object, the middlewares, the response): at 4x a model's capacity in
an open loop, refusals took most of the core and the model kept 0.37 of its capacity
(tools/bench_overload.py). So the connection guard (connections.py, framing.py) frames every
request, and for ACTIVE_S after any HTTP overload refusal it offers each request head here
first: when the queue level the request would join has no room, the guard reads the body
(held back until it is whole, to see whether it names a priority), sends the same 503 with
Retry-After itself and drops the request; aiohttp never sees it (a quarter of the cost, most of
it the kernel's; the same model then kept 0.75-0.85). gRPC refusals do not turn this on.

Only the plain case is refused here; everything else goes through aiohttp as before: an
HTTP/1.1 request that does not end its connection and sends Content-Length (no Expect, no
Content-Encoding), for a serving version, whose level, the default one (the body names no
"priority"), is full. Not while tracing or the request log want every request, nor when
inference needs an API token (the 401 comes first). The body must be in hand to see whether it names a priority (in its
JSON: the whole body, or the part before the binary tensors): one still arriving is held back
until it has come, up to BODY_PEEK_BYTES (a connection's read buffers hold that much anyway),
larger ones go through aiohttp; a body that may spell "priority" with an escape (\\u) goes
there too.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import orjson

from ..errors import ServeError
from .codec import parse_header_length
from .failure_reasons import failure_reason
from .framing import NEED_BODY
from .json_tensors import loads
from .plain import guard_may_refuse, infer_target
from .request_head import Head

BODY_PEEK_BYTES = 64 * 1024
ACTIVE_S = 2.0  # how long after an overload refusal request heads are checked here
TARGET_TTL_S = 1.0  # how long the paths' version lookups are reused (a reload changes them)
MAX_TARGETS = 1024


@functools.lru_cache(maxsize=256)  # a few distinct answers (one per level and Retry-After)
def refusal(message: str, retry_after: int, close: bool = False) -> bytes:
    """A whole 503 answer with Retry-After, written by the connection guard itself (`close`:
    it says the connection ends)."""
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"
            b"%sContent-Length: %d\r\n\r\n%s"
            % (retry_after, b"Connection: close\r\n" if close else b"", len(body), body))


_UNREADABLE = -1


def _json_length(head: Head) -> int | None:
    """The length of the body's JSON part (None: all of it), or _UNREADABLE when the head says
    what is not read here (a Content-Encoding, a malformed Inference-Header-Content-Length, or
    either given twice, which aiohttp's path refuses: 400, 415); once per Head (framing's memo)."""
    values = head.header_all(b"inference-header-content-length")
    if (head.header_all(b"content-encoding") not in ([], [b"identity"]) or len(values) > 1
            or (values and (not values[0].isdigit() or len(values[0]) > 18))):  # int() refuses 4,300 digits
        return _UNREADABLE
    return int(values[0]) if values else None


_Y_LOOKS = 32  # the 'y's of "priority" looked at by memchr before a full search


def may_name_priority(json_text: bytes) -> bool:
    """Whether a body's JSON may name a priority: it holds "priority", or a backslash (an escape
    could spell it). Searching a 72 KB body of numbers for the two words took 85 us, more than
    the rest of a refusal: a backslash is found by memchr, and "priority" by its last letter,
    rare in a body of numbers (only "datatype" and "binary_data" have one); past _Y_LOOKS of
    them, by a full search."""
    if b"\\" in json_text:
        return True
    at = json_text.find(b"y")
    for _ in range(_Y_LOOKS):
        if at < 0:
            return False
        if json_text[max(0, at - 7):at + 1] == b"priority":
            return True
        at = json_text.find(b"y", at + 1)
    return b"priority" in json_text


def refuse_undecoded(batcher, body: bytes | memoryview, json_length: int | None) -> None:
    """Raise QueueFull for a read request that names no priority while its level is full,
    before its JSON is decoded (which would come to the same refusal): the requests the guard
    cannot refuse itself (bodies over BODY_PEEK_BYTES, compressed or traced ones, those of a
    server not yet shedding) cost the decode of their JSON each, 0.4-0.5 ms of the event loop
    for the medium CNN's 72 KB, then a refusal. `json_length`: the JSON part's (None: all)."""
    if batcher.default_level_full():
        text = body if json_length is None else memoryview(body)[:json_length]
        if not may_name_priority(bytes(text)):
            raise batcher.refuse_default_level()


ID_READ_BYTES = 4096  # the largest JSON part read for the id of a request refused undecoded


def stated_id(body: bytes | memoryview, json_length: int | None, limits) -> str | None:
    """The id a request refused by refuse_undecoded states in its body (its top-level "id"), for
    its trace and request log line: its JSON part is parsed for it, by the codec's own parser (the
    id decoding would have read), only when at most ID_READ_BYTES (binary tensors' JSON, a small
    model's: a few microseconds); a larger one is the decode the refusal saves, and its request is
    named by its X-Request-Id header alone. Looking for the id in the text without parsing it was
    measured and not kept: finding '"id"' costs about 1 ns a byte (70 us for 72 KB), telling a
    top-level key from a nested one (brackets counted outside strings) 3 ns a byte more, and no
    bounded walk covers a body of many strings. `limits`: the model's JsonLimits."""
    size = _id_part_length(len(body), json_length)
    if size is None:
        return None
    try:
        doc = loads(body if size == len(body) else memoryview(body)[:size], limits)
    except ServeError:  # (its decode would have refused it, naming no id)
        return None
    rid = doc.get("id") if type(doc) is dict else None
    return rid if type(rid) is str else None


def _id_part_length(body_length: int, json_length: int | None) -> int | None:
    """How many bytes from the body's start stated_id parses (its JSON part), or None: none, the
    part being over ID_READ_BYTES or past the body (its decode would refuse that)."""
    size = body_length if json_length is None else json_length
    return None if size > min(ID_READ_BYTES, body_length) else size


def stated_id_as_sent(body_length: int, header_length: list[str], limits,
                      take: Callable[[int], bytes | memoryview | None]) -> str | None:
    """stated_id of a request refused before its model version is found (404, 503, shutting down:
    infer_pipeline.counted_infer's `body_id`), on either HTTP path: `header_length` its
    Inference-Header-Content-Length values as sent (a malformed one names no id: its decode would
    have refused it), `limits` the server's JsonLimits (no model's is known), `take(size)` the
    body's first `size` bytes, or None where they are not in hand. Asked for a size, not given
    the body: aiohttp's path reads them from its stream (infer.py), which it can do only once it
    knows how many, and only what has arrived."""
    try:
        json_length = parse_header_length(header_length)
    except ServeError:
        return None
    size = _id_part_length(body_length, json_length)
    json_text = None if size is None else take(size)
    return None if json_text is None else stated_id(json_text, None, limits)


class EarlyRefusal:
    """Owned by the server state; `check(head, body_length, body)` is called by the
    connection guard on the loop for every request head it frames. Most requests find room,
    so that answer comes first and cheapest: the path's version is looked up at most once a
    second, and the request's other headers are read only when it may be refused."""

    def __init__(self, state):  # server.state.ServerState, which owns this
        self._state = state
        self._targets: dict[bytes, object] = {}  # path -> served version, or None
        self._cleared_at = 0.0
        self._active_until = 0.0
        self.refused = 0

    def active(self) -> bool:
        """Whether heads are offered to `check` now: for ACTIVE_S after any overload refusal
        (`overloaded()`, or one made here). Otherwise the guard only frames requests, which
        is cheaper than asking about each (framing alone cost about 4 us a request before
        framing's head memo)."""
        return time.monotonic() < self._active_until

    def overloaded(self) -> None:
        """A request was refused for want of room (QueueFull through aiohttp's path, or here)."""
        self._active_until = time.monotonic() + ACTIVE_S

    def check(self, head: Head, body_length: int, body: memoryview | None) -> ServeError | str | None:
        """None: aiohttp takes the request. NEED_BODY: ask again with the whole body. A
        ServeError (QueueFull): refuse the request with it; it is counted like any refusal, its
        time in the statistics' `fail` the time of this call (it comes as its head or body does)."""
        started = time.perf_counter_ns()
        if head.method != b"POST":
            return None
        served = self._served(head.target)
        if served is None or not served.batcher.default_level_bounded():
            return None
        state = self._state
        json_length = head.derived("early", _json_length)
        if (state.shutting_down or body_length > BODY_PEEK_BYTES or not guard_may_refuse(head, state)
                or json_length == _UNREADABLE):
            return None  # not counted either: the queue itself judges it (its room is what counts)
        if body is None:  # still coming: counted as of the default level while there is room (a
            # burst of them is refused early beyond it), held back to be read only when it would be
            # refused (one held back whose body stalls gets no 408: the header timeout ends it)
            return None if served.batcher.admit_unread() else NEED_BODY
        if json_length is not None:
            body = body[:json_length]  # only the JSON part: the tensors' bytes are not text
        # Only a request known to join the default level counts against its room: one naming
        # another level counted too, and refused others of that level, 503 "queue is full"
        # with the level empty, when a burst was read in one pass of the loop
        if may_name_priority(bytes(body)) or served.batcher.admit_unread():
            return None
        error = served.batcher.refuse_default_level()
        state.record(served).request_failed(failure_reason(error), time.perf_counter_ns() - started)
        self.refused += 1
        self.overloaded()
        return error

    def _served(self, target: bytes):
        """The version an infer path names (None: not an infer path, or not serving). The
        lookups are dropped together on the first call TARGET_TTL_S after the last drop, so a
        reload is seen within a second of traffic."""
        now = time.monotonic()
        if now >= self._cleared_at + TARGET_TTL_S:
            self._targets.clear()
            self._cleared_at = now
        if target in self._targets:
            return self._targets[target]
        served = None
        named = infer_target(target)
        if named is not None:
            try:
                served = self._state.repo.get(*named)
            except ServeError:
                pass  # aiohttp's route says what is wrong
        if len(self._targets) < MAX_TARGETS:
            self._targets[target] = served
        return served
