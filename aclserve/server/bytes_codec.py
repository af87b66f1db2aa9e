"""BYTES tensors of a KServe v2 request: the encoded images of an image input. Pure functions
over bytes, like codec.py, which calls decode_input for every input whose datatype is BYTES.
Element framing follows the KServe v2 protocol's tensor data and Triton's binary tensor data
extension (triton-inference-server/server, docs/protocol/extension_binary_data.md).

Framing (HTTP): JSON `data` is an array (flat or nested) of base64 strings, one per row; the binary
extension carries elements as a 4-byte little-endian length then the bytes, concatenated; a raw
binary request (Inference-Header-Content-Length: 0) is one image. The shape is [N] or [N, 1];
N rows, each one image. gRPC: the raw_input_contents entry holds length-prefixed elements, or
contents.bytes_contents the images (grpc_input). Elements are memoryviews into the body (no copy) or decoded base64.
"""
from __future__ import annotations

import base64
import binascii
import math
import re

from ..errors import InvalidInput
from ..images.header import JPEG_SOI, PNG_SIGNATURE
from ..input_refusals import no_rows, rows_differ
from ..runtime.types import TensorSpec
from .binary_data import check_binary_data_fits, check_binary_data_size
from .json_simd import JsonNumbers
from .parameters import refuse_compound_values

_U32 = 4
# Dimensions of a refused shape that are read and quoted: a longer shape is refused by its length
# alone (reading 1,000,000 of them in Python and quoting them took the event loop 80 ms over HTTP,
# 7,000,000 over gRPC 0.7 s). Used by codec.py too.
MAX_QUOTED_DIMS = 64


def check_rows(name: str, shape, spec: TensorSpec, max_batch: int, rows: int | None) -> tuple[int, int | None]:
    """Shape [N] or [N, 1] of a BYTES input -> (N, the request's batch rows so far)."""
    if type(shape) is not list or not 1 <= len(shape) <= 2 or any(type(d) is not int or d < 0 for d in shape) \
            or (len(shape) == 2 and shape[1] != 1):
        shown = f"{len(shape):,} dimensions" if type(shape) is list and len(shape) > MAX_QUOTED_DIMS else repr(shape)
        raise InvalidInput(f"input '{name}': shape must be [N] or [N, 1] (one image per row), got {shown}")
    count = shape[0]
    fixed = spec.shape[0]
    if fixed == -1:
        if count < 1:
            raise InvalidInput(no_rows(name))
        if max_batch and count > max_batch:
            raise InvalidInput(f"input '{name}': batch size {count} exceeds the model's max_batch_size {max_batch}")
        if rows is not None and count != rows:
            raise InvalidInput(rows_differ(name, count, rows))
        rows = count
    elif count != fixed:
        raise InvalidInput(f"input '{name}': {count} images for a model that takes exactly {fixed}")
    return count, rows


def grpc_input(name: str, shape: list, raw: bytes | None, contents: list | None, spec: TensorSpec,
               max_batch: int, rows: int | None) -> tuple[list, int | None]:
    """A gRPC BYTES input: its raw_input_contents entry (length-prefixed elements) or its
    contents.bytes_contents -> (elements, batch rows)."""
    count, rows = check_rows(name, shape, spec, max_batch, rows)
    if raw is not None:
        return binary_elements(name, memoryview(raw), count), rows
    if not contents and count:
        raise no_grpc_data(name, "bytes_contents")
    if len(contents) != count:
        raise InvalidInput(f"input '{name}': contents.bytes_contents has {len(contents)} elements but the "
                           f"shape needs {count}")
    return list(contents), rows


def no_grpc_data(name: str, field: str) -> InvalidInput:
    """The refusal of a gRPC input sent with no data at all (a `contents.<field>` that is there but
    of the wrong size says its count), in the words HTTP refuses one without "data"."""
    return InvalidInput(f"input '{name}' has neither raw_input_contents nor contents.{field}")


def decode_input(name: str, item: dict, spec: TensorSpec, max_batch: int, rows: int | None,
                 body: bytes, offset: int, framed: bool) -> tuple[list, int, int | None]:
    """One BYTES input of a request -> (elements, new binary offset, batch rows)."""
    count, rows = check_rows(name, item.get("shape"), spec, max_batch, rows)
    params = item.get("parameters")
    params = {} if params is None else params
    if type(params) is not dict:
        raise InvalidInput(f"input '{name}': parameters must be an object")
    if any(k.startswith("shared_memory_") for k in params):
        raise InvalidInput(f"input '{name}': shared memory is not supported by this server")
    refuse_compound_values(params, f"input '{name}'")
    size = params.get("binary_data_size")
    if size is None:
        data = item.get("data")
        if data is None:
            raise InvalidInput(f"input '{name}' has neither data nor parameters.binary_data_size")
        if type(data) is JsonNumbers:  # numbers where strings belong: the list says so
            data = data.as_list()
        return json_elements(name, data, count), offset, rows
    check_binary_data_size(name, item, size, framed)
    check_binary_data_fits(name, size, body, offset)
    return binary_elements(name, memoryview(body)[offset:offset + size], count), offset + size, rows


def binary_elements(name: str, chunk: memoryview, count: int) -> list[memoryview]:
    """`count` length-prefixed elements filling `chunk` exactly."""
    out, pos, end = [], 0, len(chunk)
    for row in range(count):
        if pos + _U32 > end:
            raise InvalidInput(f"input '{name}' row {row}: binary data ends before the element's 4-byte length")
        n = int.from_bytes(chunk[pos:pos + _U32], "little")
        pos += _U32
        if pos + n > end:
            raise InvalidInput(f"input '{name}' row {row}: element of {n} bytes overruns the "
                               f"{end}-byte binary data{_unprefixed_picture(chunk[pos - _U32:pos + 4])}")
        out.append(chunk[pos:pos + n])
        pos += n
    if pos != end:
        raise InvalidInput(f"input '{name}': {end - pos} bytes after the {count} elements its shape gives")
    return out


def _unprefixed_picture(head: memoryview) -> str:
    """A hint when the bytes read as an element's length begin a picture: a PNG's signature reads
    as 1,196,314,761 bytes, and that alone did not say the length prefix was left out."""
    for signature, kind in ((PNG_SIGNATURE, "PNG"), (JPEG_SOI + b"\xff", "JPEG")):
        if bytes(head).startswith(signature):
            return (f" (its length bytes begin a {kind}: a picture sent without its 4-byte little-endian length "
                    "before it?)")
    return ""


def json_elements(name: str, data, count: int) -> list[bytes]:
    """Base64 strings (flat or nested one level, [[s], [s]]) -> raw bytes."""
    if type(data) is not list:
        raise InvalidInput(f"input '{name}': data must be an array of base64 strings")
    flat = [d[0] if type(d) is list and len(d) == 1 else d for d in data]
    if len(flat) != count:
        raise InvalidInput(f"input '{name}': data has {len(flat)} elements but the shape needs {count}")
    out = []
    for row, text in enumerate(flat):
        if type(text) is not str:
            raise InvalidInput(f"input '{name}' row {row}: BYTES data elements must be base64 strings")
        try:
            out.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise InvalidInput(f"input '{name}' row {row}: not valid base64{_base64_hint(text)}") from None
    return out


_BASE64_HINTS = ((re.compile(r"\s"), "a space or line break (base64 tools wrap lines: `base64 -w0`)"),
                 (re.compile(r"^data:"), "a data: URI prefix (send what follows the comma)"),
                 (re.compile(r"[-_]"), "'-' or '_' (the URL-safe alphabet; standard base64 uses '+' and '/')"),
                 (re.compile(r"[^A-Za-z0-9+/=]"), "a character outside the base64 alphabet"),
                 (re.compile(r"=[^=]"), "'=' before its end (padding closes the string: several pictures "
                                        "joined into one?)"))


def _base64_hint(text: str) -> str:
    """What a string refused as base64 holds that the standard alphabet does not (checked only
    once it was refused), or what else is wrong with it."""
    for pattern, what in _BASE64_HINTS:
        found = pattern.search(text, 0, 1 << 20)  # a bounded look: the message is a courtesy
        if found is not None:
            return f": it has {what} at character {found.start()}"
    return ": its length is not a multiple of 4 (padding '=' missing?)" if len(text) % 4 else ""


def raw_input(spec: TensorSpec, body: bytes) -> list[memoryview]:
    """A raw binary request for a single BYTES input: the whole body is one element."""
    if spec.shape[0] not in (-1, 1):
        raise InvalidInput(f"a raw binary request carries one image; input '{spec.name}' takes "
                           f"{math.prod(spec.shape[:1])}")
    return [memoryview(body)]
