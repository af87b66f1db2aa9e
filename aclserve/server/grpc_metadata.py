"""A gRPC call whose request metadata (its HTTP/2 headers) is over METADATA_BYTES, refused
RESOURCE_EXHAUSTED as grpc.aio looks up its method, before any handler or message.

grpc core counts a call's metadata as HPACK does (RFC 7541 4.1: each entry's key and value and 32
bytes) and refuses a call past `grpc.absolute_max_metadata_size` itself: server_options sets it,
and `grpc.max_metadata_size`, to METADATA_BYTES, so that a call under it always passes (between
grpc's defaults, 8 and 16 KiB, calls were refused at random). But core takes that limit from the
SETTINGS the client has acknowledged (chttp2 parses headers against its
`settings.acked().max_header_list_size()`): until the client acknowledges the server's SETTINGS
frame, which a client may put off until grpc's settings timeout (60 s) closes it, grpc's own
default holds, 16 MiB a call, and no channel argument sets it (nor is that timeout shortened: it
times every SETTINGS frame of a connection, those a bandwidth estimate sends mid-transfer too,
whose acknowledgement may wait behind megabytes a slow client is still sending). HPACK makes such
metadata cheap to send: one byte references an entry of the connection's table, where core keeps
some 160-270 bytes an entry (a copy of it), so 100 calls of 100,000 references, 10 MB sent on one connection, took the
server's RSS from 116 MB to 1.6-1.7 GB (README, "Limits", gRPC). Core has parsed the headers before
the server sees the call, so that peak stays; but core keeps a call's metadata until the call ends,
and this ends such a call as soon as the loop reaches it, then has the heap trimmed (trim.py):
the RSS stayed at 1.1-1.15 GB after that attack, now it is back to 164 MB within 20 s.

What the server sees is counted: the metadata grpc passes it, without the pseudo-headers and the
few headers grpc keeps (:path, :authority, content-type, te, grpc-timeout, ...: some 400-500
bytes), which core's own count has. Event-loop thread only.
"""
from __future__ import annotations

from typing import Callable

import grpc

ENTRY_OVERHEAD = 32  # an entry's bytes beside its key and value, as HPACK and grpc count them
# What real clients send fits with room to spare: tritonclient's and the KServe SDK's headers (with
# the pseudo-headers core counts, under 600 bytes), the longest API token gRPC takes
# (auth.MAX_GRPC_TOKEN: 4,148 bytes as `authorization: Bearer ...`), W3C traceparent and tracestate
# (under 700), an x-request-id: 5.4 KB; and what a proxy may add (cookies a grpc-web proxy forwards,
# a large JWT, Envoy's x-forwarded-client-cert). grpc's own hard limit (its soft one, 8 KiB, refused
# calls between the two at random: a reviewer would not have 8 KiB refused every time)
METADATA_BYTES = 16384
# about what grpc core holds a call's metadata entry in (measured: 160 to 270 bytes): what a refused
# call's end frees, for the heap trim
ENTRY_HEAP_BYTES = 270


def metadata_bytes(metadata, past: int = METADATA_BYTES) -> int:
    """The bytes of `metadata` ((key, value) pairs) as grpc counts them, counted until they are
    over `past` (a call of 100,000 entries is refused after a few hundred of them)."""
    total = 0
    for key, value in metadata or ():
        total += len(key) + len(value) + ENTRY_OVERHEAD
        if total > past:
            break
    return total


def refusal(entries: int) -> str:
    return (f"request metadata over {METADATA_BYTES:,} bytes, in {entries:,} entries (each counts its key and value "
            f"and {ENTRY_OVERHEAD} bytes, as grpc counts them): send less metadata")


class MetadataScreen:
    """Owned by the endpoint (grpc_server.GrpcServer), whose dispatcher asks `screen(details)`
    first for every call (grpc_queued.py): for a call over METADATA_BYTES, a handler that refuses
    it, wrapped by `wrap` as the endpoint's methods are (grpc_live.LiveCalls.counted, which counts
    it started: grpc_refusals.py); else None. `freed(nbytes)` (HeapTrimmer.freed) is told what the
    call held once it has ended. Counted nowhere for /metrics: a call grpc core refused itself (after
    the client's acknowledgement) reaches the server too, its metadata cut near the limit, so that
    the server cannot tell its own refusals from grpc's."""

    def __init__(self, wrap: Callable[[grpc.RpcMethodHandler, str], grpc.RpcMethodHandler],
                 freed: Callable[[int], None]):
        self._wrap = wrap
        self._freed = freed

    def screen(self, details) -> grpc.RpcMethodHandler | None:
        metadata = details.invocation_metadata or ()
        if metadata_bytes(metadata) <= METADATA_BYTES:
            return None
        entries = len(metadata)

        async def refuse(_requests, context) -> None:
            context.add_done_callback(lambda _: self._freed(entries * ENTRY_HEAP_BYTES))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal(entries))
        return self._wrap(grpc.stream_unary_rpc_method_handler(refuse), details.method.rpartition("/")[2])
