"""Triton's binary tensor data extension as a request uses it: the Inference-Header-Content-Length
header (HEADER_LENGTH), which says how much of the body is JSON, the binary data following it, and
an input's parameters.binary_data_size, checked here alike for the inputs codec.py decodes and
the BYTES ones bytes_codec.py does (triton-inference-server/server,
docs/protocol/extension_binary_data.md). Pure functions, like codec.py."""
from __future__ import annotations

from ..errors import InvalidInput

HEADER_LENGTH = "Inference-Header-Content-Length"


def check_binary_data_size(name: str, item: dict, size, framed: bool) -> None:
    """Input `name` (its JSON object `item`) states binary_data_size `size`: a non-negative integer, in
    a request whose header says where the binary data begins (`framed`), and no `data` beside it."""
    if type(size) is not int or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
    if not framed:
        raise InvalidInput(f"input '{name}' has binary_data_size but the request has no "
                           f"{HEADER_LENGTH} header")
    if "data" in item:
        raise InvalidInput(f"input '{name}' has both data and binary_data_size")


def check_binary_data_fits(name: str, size: int, body: bytes, offset: int) -> None:
    """Input `name`'s `size` bytes of binary data, at `offset` of the body, are all there."""
    if offset + size > len(body):
        raise InvalidInput(f"input '{name}': binary data needs {size} bytes at offset {offset} "
                           f"but only {len(body) - offset} follow there (the body has {len(body)})")
