"""What the JSON part of one request may hold, checked on its bytes before it is parsed.

The parse (orjson, or simdjson: json_tensors.loads) runs on the event loop and builds the whole
object graph before anything can be checked, so the text is bounded first, each bound read in
C: its size (`max_json_bytes`); when it is longer than `max_json_elements` bytes, an upper bound
of the values it holds (one per `,`, `[` and `{`), since the graph costs up to ~37 bytes of
memory per byte of JSON (`[[]],` repeated); and, when it is longer than KEYS_FROM_BYTES, an
upper bound of its objects' keys (one per `:`, those inside strings included), since a key costs
the parse far more than a number: 800,000 distinct keys in a request's `parameters` (15 MB, within
both limits above) held the event loop 0.7 s, where a 16 MB body of numbers takes about 0.1 s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInput, PayloadTooLarge

BINARY_HINT = "send large tensors with the binary tensor extension"
# Keys a request's JSON may hold, in all its objects: a KServe request has a few an input or an
# output, and a few parameters. A long key costs the parse about 1.2 us more than its bytes:
# 16,384 distinct keys in 15 MB took 79 ms to decode, one 15 MB string 63, 32,760 keys 119
MAX_JSON_KEYS = 16_384
# a key takes at least 5 bytes (`"":0,`): a shorter text cannot hold more than MAX_JSON_KEYS, and
# its colons are not counted
KEYS_FROM_BYTES = 5 * MAX_JSON_KEYS
# colons found one by one (memchr) before numpy counts them all: a request has a handful, and
# finding the medium CNN's 5 in its 91 KB takes 4 us, numpy's count 13-27
_COLONS_FOUND = 64


@dataclass(frozen=True)
class JsonLimits:
    """What the JSON part of one request may hold (config keys max_json_bytes, max_json_elements)."""

    max_bytes: int = 16 * 1024 * 1024
    max_elements: int = 1024 * 1024


def check_json_size(size: int, limits: JsonLimits) -> None:
    """PayloadTooLarge when a JSON part of `size` bytes is over max_json_bytes (check_before_parse,
    and an `Expect: 100-continue` from its Inference-Header-Content-Length: infer.expect_body)."""
    if size > limits.max_bytes:
        raise PayloadTooLarge(f"the JSON part of the request is {size} bytes, over the limit of "
                              f"{limits.max_bytes} (max_json_bytes); {BINARY_HINT}")


def check_before_parse(raw: bytes | memoryview, limits: JsonLimits) -> None:
    """PayloadTooLarge when `raw` is over max_json_bytes or may hold more than max_json_elements
    values; InvalidInput when it may hold more than MAX_JSON_KEYS keys."""
    size = len(raw)
    check_json_size(size, limits)
    if size > limits.max_elements and value_bound(raw) > limits.max_elements:
        raise PayloadTooLarge(f"the JSON part of the request holds more than {limits.max_elements} "
                              f"values (max_json_elements); {BINARY_HINT}")
    if size > KEYS_FROM_BYTES and _may_hold_too_many_keys(raw):
        raise InvalidInput(f"the JSON part of the request holds more than {MAX_JSON_KEYS:,} object keys (counted "
                           f"by its ':' characters, those in strings too); a request needs a few an input")


def value_bound(raw: bytes | memoryview) -> int:
    """At least the number of JSON values in `raw`: every value but the first of a container
    follows a comma, and there is one container per bracket or brace."""
    return _count(raw, ",") + _count(raw, "[") + _count(raw, "{") + 1


def _may_hold_too_many_keys(raw: bytes | bytearray | memoryview) -> bool:
    """Whether `raw` holds more than MAX_JSON_KEYS colons (an upper bound of its keys)."""
    find = getattr(raw, "find", None)  # (a memoryview, a binary request's JSON part, has none)
    if find is not None:
        at = find(b":")
        for _ in range(_COLONS_FOUND):
            if at < 0:
                return False
            at = find(b":", at + 1)
    return _count(raw, ":") > MAX_JSON_KEYS


def _count(raw: bytes | memoryview, char: str) -> int:
    """How many times the ASCII `char` occurs in `raw` (numpy: 1.5x bytes.count's speed)."""
    return int(np.count_nonzero(np.frombuffer(raw, np.uint8) == ord(char)))
