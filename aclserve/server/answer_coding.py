"""Which content coding an answer gets, from the request's Accept-Encoding, weights honoured.

aiohttp's own choice (`enable_compression()` without a coding) takes the first of deflate and
gzip named anywhere in the header, so `gzip;q=0` (gzip refused) got gzip and
`deflate;q=0.1, gzip;q=1` got deflate. Here, as Triton (http_server.cc, CompressionTypeUsed):
the first entry of the strictly highest weight above 0 among identity, gzip and deflate wins
(`gzip, deflate`: gzip; `identity;q=0.5, gzip;q=0.5`: none). Unlike Triton, `*` (RFC 9110
12.5.3: any coding not named) stands for gzip, else deflate, at its weight, when it weighs
more than every entry named.
"""
from __future__ import annotations

import zlib

from aiohttp.web import ContentCoding

COMPRESS_MIN_BYTES = 1024  # smaller answers gain nothing from compression and cost CPU

CODINGS = {"gzip": ContentCoding.gzip, "x-gzip": ContentCoding.gzip, "deflate": ContentCoding.deflate,
           "identity": None}


def weights(header: str) -> dict[str, float]:
    """Coding (lower case) -> weight, in the header's order; an entry whose weight cannot be
    read is left out."""
    found: dict[str, float] = {}
    for entry in header.split(","):
        coding, _, params = entry.partition(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = -1.0
        if 0.0 <= weight <= 1.0 and coding not in found:
            found[coding] = weight
    return found


def answer_coding(header: str) -> ContentCoding | None:
    """The coding to compress an answer with, or None: send it as it is."""
    given = weights(header)
    best, best_weight = None, 0.0
    for coding, weight in given.items():
        if coding in CODINGS and weight > best_weight:
            best, best_weight = CODINGS[coding], weight
    if given.get("*", 0.0) > best_weight:
        named = {CODINGS[coding] for coding in given if coding in CODINGS}
        return next((c for c in (ContentCoding.gzip, ContentCoding.deflate) if c not in named), best)
    return best


def encoded(body: bytes, coding: ContentCoding) -> bytes:
    """`body` in `coding` (deflate zlib-wrapped, as aiohttp writes it), for an answer compressed
    in a worker thread rather than on the event loop."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31 if coding is ContentCoding.gzip else 15)
    return compressor.compress(body) + compressor.flush()
