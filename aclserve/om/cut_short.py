"""Whether an ONNX file protobuf refuses is a model cut short, in words.

protobuf says only "Error parsing message with type 'onnx.ModelProto'", the same for a file of
garbage and for a model whose copy or download stopped early (a tester's truncated .onnx read
"not an ONNX model" with no hint). A model's top-level fields are few (its graph one field), so
walking their tags and lengths tells the two apart: the first field the ir_version (protobuf
writes fields in their numbers' order), every field one ModelProto has, with its wire type, and
the last one running past the end of the file. Reads the tags only (mmap).
"""
from __future__ import annotations

import mmap

import onnx

from ..regular_files import open_regular
from ..protobuf_wire import LEN, VARINT, WireError, varint

MOST_IR_VERSION = 100  # (11 in 2025): a first field past it is no model's
CUT = "cut short (a copy or download not finished?)"


def _wire_types() -> dict[int, tuple[str, int]]:
    """ModelProto's fields: number -> (name, the wire type it is written with)."""
    out = {}
    for field in onnx.ModelProto.DESCRIPTOR.fields:
        wire = LEN if field.type in (field.TYPE_MESSAGE, field.TYPE_STRING, field.TYPE_BYTES) else VARINT
        out[field.number] = (field.name, wire)
    return out


def cut_short(path: str) -> str | None:
    """For an ONNX file protobuf refused: `its graph (field 7) runs to byte 515,342 but the
    file ends at 30,000: cut short (a copy or download not finished?)`, or None when its fields do
    not read as a model's that the end of the file cuts (garbage, or a fault inside a field)."""
    try:
        with open_regular(path) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _cut_where(memoryview(mapped))
    except (OSError, ValueError):  # gone since, or empty (mmap refuses a size of 0)
        return None


def _cut_where(buf: memoryview) -> str | None:
    known = _wire_types()
    size, pos = len(buf), 0
    try:
        while pos < size:
            first = pos == 0
            key, pos = _varint(buf, pos)
            number, wire = key >> 3, key & 7
            if known.get(number, (None, None))[1] != wire or first != (number == 1):
                return None  # no field of a model, or its bytes do not begin with its ir_version: not ONNX
            if wire == VARINT:
                value, pos = _varint(buf, pos)
                if first and not 0 < value < MOST_IR_VERSION:
                    return None
                continue
            length, start = _varint(buf, pos)
            pos = start + length
            if pos > size:
                field = f"{known[number][0]} (field {number})"
                return f"its {field} runs to byte {pos:,} but the file ends at {size:,}: {CUT}"
        return None
    except _EndsInside:
        return f"the file ends inside a field's tag, length or value, at byte {size:,}: {CUT}"
    except WireError:  # a varint over 10 bytes: no model's
        return None
    finally:
        buf.release()


class _EndsInside(Exception):
    """A varint the end of the file cuts."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    size = len(buf)
    if size - pos < 10 and all(b >= 0x80 for b in buf[pos:]):  # (nothing left, or no last byte)
        raise _EndsInside
    return varint(buf, pos, size)
