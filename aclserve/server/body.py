"""Read a request body within the memory budget, the size limit and the body timeout.

The server runs with aiohttp's automatic decompression off, so the bytes read here are what
the client sent; gzip and deflate bodies are inflated here, in bounded steps, and each step is
charged to the request's lease and checked against `max_body_bytes` (and, past INFLATE_GRACE, the
ratio to the compressed bytes, `max_inflate_ratio`) before the next: a small
body that inflates to gigabytes stops at the limit with 413, holding at most the limit. The
declared Content-Length is checked before anything is read (413 over the route's limit or
max_request_bytes, 503 over what the budget has left then) but not charged: a body is charged as
its bytes arrive (a quarter ahead of them at most, never past the declared length), so what a
client declares and does not send holds nothing (8 heads declaring 64 MiB each and sending no
byte held the whole 512 MiB budget for body_timeout_s, every other request 503). A client that
has not sent the whole body within `body_timeout_s` gets 408 and its connection is closed.
"""
from __future__ import annotations

import asyncio
import contextlib
import zlib

from aiohttp import web

from ..errors import InvalidInput, PayloadTooLarge, ServeError
from .budget import SMALLER_HINT, Lease, MemoryExhausted
from .open_calls import OpenCalls
from .stalled_bodies import STALL_S, Arrival, StalledBodies

try:
    from asyncio import timeout_at
except ImportError:  # Python 3.10: aiohttp depends on async-timeout there
    from async_timeout import timeout_at  # type: ignore[no-redef]

INFLATE_STEP = 1 << 20  # bytes inflated per step, each charged before the next
INFLATE_GRACE = 4 << 20  # bytes a body may inflate to whatever its ratio (max_inflate_ratio)


class BodyTimeout(ServeError):
    """The client stopped sending its body (408; the connection is closed)."""


class BodyOverBudget(MemoryExhausted):
    """A body outgrew what the memory budget had left while it arrived (503 with Retry-After,
    as any budget refusal; the connection is closed, the rest of the body dropped)."""


class UnsupportedEncoding(ServeError):
    """A Content-Encoding other than gzip / deflate / identity (415)."""


class UnsupportedTransferCoding(UnsupportedEncoding):
    """A Transfer-Encoding coding other than chunked (501, RFC 9112 6.1): aiohttp's parser reads the
    chunks and ignores the rest, so a body sent `gzip, chunked` was read as if not gzipped."""


# gzip members a body may have: clients send one (a few when they concatenate); thousands of
# empty ones cost the loop a new decompressor and a copy of the rest of the chunk each, seconds
# for a few MB, without inflating a byte that the body limit would count
MAX_GZIP_MEMBERS = 64


class _Inflater:
    """gzip (possibly multi-member, at most MAX_GZIP_MEMBERS) or deflate (zlib-wrapped, or raw
    as some clients send), inflating to at most `max_ratio` times the compressed bytes once past
    INFLATE_GRACE (0: any ratio)."""

    def __init__(self, encoding: str, max_ratio: int = 0):
        self.encoding = encoding
        self._max_ratio = max_ratio
        self._inflated = 0
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        self._members = 1
        self._consumed = 0  # compressed bytes inflated so far

    def feed(self, data: bytes, step: int):
        """Yield inflated pieces of at most `step` bytes."""
        while data:
            if self._z is None:  # deflate: pick the variant from the first byte (RFC 1950 CM)
                self._z = zlib.decompressobj(zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS)
            try:
                piece = self._z.decompress(data, step)
            except zlib.error as e:
                raise InvalidInput(f"request body is not valid {self.encoding} data (Content-Encoding: "
                                   f"{self.encoding}): {e}") from None
            ended = self._z.eof
            rest = self._z.unused_data if ended else self._z.unconsumed_tail
            self._consumed += len(data) - len(rest)
            self._inflated += len(piece)
            if self._max_ratio and self._inflated > max(INFLATE_GRACE, self._max_ratio * self._consumed):
                raise PayloadTooLarge(f"request body inflates to more than {self._max_ratio} times the compressed "
                                      f"bytes read so far ({self._inflated:,} from {self._consumed:,}; "
                                      f"Content-Encoding: {self.encoding}; max_inflate_ratio): send it uncompressed")
            if piece:
                yield piece
            data = rest
            if ended:
                if data and self.encoding != "gzip":
                    raise InvalidInput(f"request body has data after the end of its {self.encoding} stream")
                if data:
                    self._members += 1
                    if self._members > MAX_GZIP_MEMBERS:
                        raise InvalidInput(f"request body has more than {MAX_GZIP_MEMBERS} gzip members")
                    self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # next gzip member

    def finish(self) -> None:
        if self._z is None or not self._z.eof:
            raise InvalidInput(f"request body ends before its {self.encoding} stream does")


def _inflater(request: web.BaseRequest, max_ratio: int) -> _Inflater | None:
    # every header of that name, as the one list they are (RFC 9110 5.3): the first alone was
    # read, and a body gzipped twice under two `Content-Encoding: gzip` was inflated once
    codings = [c.strip().lower() for value in request.headers.getall("Transfer-Encoding", ())
               for c in value.split(",") if c.strip()]
    if any(c != "chunked" for c in codings):
        raise UnsupportedTransferCoding(f"Transfer-Encoding {', '.join(codings)!r} is not supported (send the body "
                                        "chunked alone, compressed with Content-Encoding if need be)")
    encoding = ", ".join(request.headers.getall("Content-Encoding", ())).strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Inflater("gzip", max_ratio)
    if encoding == "deflate":
        return _Inflater("deflate", max_ratio)
    raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported (use gzip, deflate or none)")


MAX_BODY_BYTES = "max_body_bytes"  # what a body limit is called unless a route's own limit is lower


def _too_large(limit: int, name: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes ({name})")


def body_limit(max_body_bytes: int, route_bytes: int, route_limit: str) -> tuple[int, str]:
    """(limit, its name) of a route that takes at most `route_bytes` (called `route_limit` in
    its 413): max_body_bytes when that is lower, so that the answer names the setting that
    applies (a 2 MB repository request was told to mind max_body_bytes, 64 MiB)."""
    if max_body_bytes <= route_bytes:
        return max_body_bytes, MAX_BODY_BYTES
    return route_bytes, route_limit


def check_declared(request: web.BaseRequest, lease: Lease, max_bytes: int,
                   limit_name: str = MAX_BODY_BYTES) -> int | None:
    """Check the declared body size (Content-Length) against `max_bytes` and the request's own
    limit, max_request_bytes (413), and what the memory budget has left now (503), before any of
    the body is read. Nothing is charged: read_body charges the bytes as they come. None when the
    body is chunked."""
    declared = request.content_length
    if declared is not None:
        if declared > max_bytes:
            raise _too_large(max_bytes, limit_name)
        lease.check(declared, "request body")
    return declared


def refuse_from_head(request: web.BaseRequest, budget, max_bytes: int, limit_name: str = MAX_BODY_BYTES,
                     hint: str = SMALLER_HINT, model: str | None = None) -> bool:
    """What read_body refuses before reading a byte, in its order, for an `Expect: 100-continue`
    to answer: a Transfer-Encoding coding but chunked (501), a Content-Encoding it does not take
    (415), then the declared size against `max_bytes` and what the memory `budget` has left (413,
    ending with `hint` as the request's lease would, and 503; for `model`'s request, what its share
    has left too), probed: nothing is kept. Returns whether the body is read as it is sent (no
    Content-Encoding to inflate)."""
    plain = _inflater(request, 0) is None
    with budget.lease(hint, model) as probe:  # (check_declared takes nothing)
        check_declared(request, probe, max_bytes, limit_name)
    return plain


async def read_body(request: web.BaseRequest, lease: Lease, max_bytes: int, timeout_s: float,
                    reads: OpenCalls | None = None, limit_name: str = MAX_BODY_BYTES,
                    max_inflate_ratio: int = 0, stalls: StalledBodies | None = None) -> bytes | bytearray:
    """The body, decoded per Content-Encoding (inflating to at most `max_inflate_ratio` times
    the compressed size past INFLATE_GRACE); every byte held is charged to `lease` first, its
    declared size checked (check_declared) before it is read. Large bodies come back as a
    bytearray grown as the bytes come (one copy of the body, not two). A wait for it is at work
    in `reads` (the server state's), which the shutdown ends (ShuttingDown: open_calls.py), and
    watched by `stalls` (the server state's), which ends it (408) once stalled when another
    request wants the memory it holds (stalled_bodies.py). `limit_name`: what a 413 calls
    `max_bytes` (body_limit)."""
    inflater = _inflater(request, max_inflate_ratio)
    declared = request.content_length  # check_declared's checks, the budget's last: a whole body's take checks it
    if declared is not None and declared > max_bytes:
        raise _too_large(max_bytes, limit_name)
    content = request.content
    if inflater is None and content.is_eof():  # already buffered (small bodies): no timer
        body = content.read_nowait(-1)
        if declared is None and len(body) > max_bytes:  # chunked: checked now that its size is known
            raise _too_large(max_bytes, limit_name)
        lease.take(len(body), "request body")
        return body
    if declared is not None:
        lease.check(declared, "request body")
    loop = asyncio.get_running_loop()
    arrival = None
    try:
        with reads.at_work() if reads is not None else contextlib.nullcontext():
            async with timeout_at(loop.time() + timeout_s) as deadline:
                with Arrival(stalls, lease, deadline) as arrival:
                    return await _read(content, inflater, lease, declared, max_bytes, limit_name, arrival)
    except asyncio.TimeoutError:
        if arrival is not None and arrival.ended:
            stalls.ended += 1
            raise BodyTimeout(f"request body ended: no byte of it came for {STALL_S:g} s or more while another "
                              f"request was refused for the request memory it held (max_inflight_bytes)") from None
        raise BodyTimeout(f"request body not received within {timeout_s:g} s (body_timeout_s)") from None


def _charge_up_to(lease: Lease, charged: int, need: int, most: int) -> int:
    """Charge `lease` for a body buffer of `need` bytes where `charged` are: a quarter ahead
    (fewer charges as it grows, and room for bytearray's over-allocation, at most an eighth) when
    that fits, never past `most` (the declared length, or the limit). The new charge."""
    ahead = min(most, need + (need >> 2))
    if ahead > need and not lease.fits(ahead - charged):
        ahead = need  # the budget is tight: what has come only
    _take_arriving(lease, ahead - charged, "request body")
    return ahead


def _take_arriving(lease: Lease, nbytes: int, what: str) -> None:
    """lease.take for a body still arriving: its budget refusal is BodyOverBudget; its 413 says
    "more than" (what it has come to: a body checked against its declared length is not refused
    here, so one that is has none, or is inflating)."""
    try:
        lease.take(nbytes, what, growing=True)
    except MemoryExhausted as e:
        raise BodyOverBudget(e.message) from None


async def _read(content, inflater: _Inflater | None, lease: Lease, declared: int | None,
                max_bytes: int, limit_name: str, arrival: Arrival) -> bytearray:
    """Into one bytearray grown as the bytes come (large buffers are remapped, not copied; no
    zeroed buffer of the declared size up front), each growth charged before it is made. The
    compressed bytes of an encoded body are inflated as they come and not kept: only what they
    inflate to is charged."""
    body = bytearray()
    charged = 0
    most = max_bytes if declared is None else declared
    wire = 0
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        arrival.came()
        wire += len(chunk)
        if wire > most:
            if declared is not None:
                raise InvalidInput("request body is longer than its Content-Length")
            raise _too_large(max_bytes, limit_name)
        if inflater is None:
            if len(body) + len(chunk) > charged:
                charged = _charge_up_to(lease, charged, len(body) + len(chunk), most)
            body += chunk
            continue
        for piece in inflater.feed(chunk, INFLATE_STEP):
            if len(body) + len(piece) > max_bytes:
                raise _too_large(max_bytes, limit_name)
            _take_arriving(lease, len(piece), "decompressed request body")
            body += piece
            if len(piece) == INFLATE_STEP:
                await asyncio.sleep(0)  # a compressed chunk can inflate for long: let others run
    if inflater is not None:
        inflater.finish()
    elif declared is not None and wire != declared:
        raise InvalidInput(f"request body has {wire} bytes, its Content-Length says {declared}")
    if charged > len(body):
        lease.drop(charged - len(body))  # a chunked body's charge ahead (one of its length is all there)
    return body
