"""Which content coding an answer gets, from the request's Accept-Encoding, weights honoured.

aiohttp's own choice (`enable_compression()` without a coding) takes the first of deflate and
gzip named anywhere in the header, so `gzip;q=0` (gzip refused) got gzip and
`deflate;q=0.1, gzip;q=1` got deflate. Here, as RFC 9110 12.5.3 and Triton: the coding of the
highest weight above 0 among those offered (gzip, deflate), `*` standing for one not named;
none when `identity`, named (or by `*`), weighs more than it. On a tie deflate, as aiohttp chose before.
"""
from __future__ import annotations

from aiohttp.web import ContentCoding

OFFERED = (ContentCoding.deflate, ContentCoding.gzip)  # in the order a tie is settled
ALIASES = {"x-gzip": "gzip"}


def weights(header: str) -> dict[str, float]:
    """Coding (lower case) -> weight; an entry whose weight cannot be read is left out."""
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
        if 0.0 <= weight <= 1.0:
            found[ALIASES.get(coding, coding)] = weight
    return found


def answer_coding(header: str) -> ContentCoding | None:
    """The coding to compress an answer with, or None: send it as it is."""
    given = weights(header)
    anything = given.get("*", 0.0)
    best, best_weight = None, 0.0
    for coding in OFFERED:
        weight = given.get(coding.value, anything)
        if weight > best_weight:
            best, best_weight = coding, weight
    identity = given.get("identity", anything)  # weighed only when named (or by `*`)
    return best if best is not None and best_weight >= identity else None
