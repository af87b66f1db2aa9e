"""Protobuf's wire format, walked in place: the fields of a message as offsets into its bytes.

Two readers need a message's layout without protobuf building it: the gRPC server, which charges
a ModelInferRequest for what parsing it will hold before it is parsed (server/grpc_wire.py), and
the CPU runtime, which gives ONNX Runtime a model's large initializers as views of the memory
that holds them instead of copies (acl/cpu/_weights.py). Both walk tags and lengths only; a
tensor's bytes are skipped, never read. Pure functions over bytes.
"""
from __future__ import annotations

from typing import Iterator

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5  # the wire types a proto3 message uses (3 and 4: groups)


class WireError(ValueError):
    """The bytes are not protobuf wire data (the message says where)."""


def varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at buf[pos:end]."""
    result = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise WireError("a varint is truncated or longer than 10 bytes")


def fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, wire type, field start, value start, value end) of each field in buf[pos:end]; for
    a length-delimited field value start:end is its payload."""
    while pos < end:
        field_start = pos
        key = buf[pos]  # one byte, as most tags and lengths are, read here: half the walk's time
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        start = pos
        if wire == LEN:
            if pos < end and buf[pos] < 0x80:
                length, start = buf[pos], pos + 1
            else:
                length, start = varint(buf, pos, end)
            pos = start + length
        elif wire == VARINT:
            _, pos = varint(buf, pos, end)
        elif wire == FIXED64:
            pos += 8
        elif wire == FIXED32:
            pos += 4
        else:  # groups (3, 4) are in no message read here; 6 and 7 do not exist
            raise WireError(f"field {number} has wire type {wire}")
        if pos > end:
            raise WireError(f"field {number} runs past the end of its message")
        if number == 0:
            raise WireError("field number 0")
        yield number, wire, field_start, start, pos


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field, encoded."""
    return encode_varint(number << 3 | LEN) + encode_varint(len(payload)) + payload


def varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3 | VARINT) + encode_varint(value)
