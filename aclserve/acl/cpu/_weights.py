"""Build an ONNX Runtime session from an ONNX model held in device (weight) memory, without copies.

ORT takes a model as Python bytes only, and copies them again into a std::string and a protobuf
before making its own tensors: from the weight memory that was four copies of the weights at once.
Instead the model's large initializers stay where they are: `split` walks the protobuf wire format
of the model in place (ModelProto.graph -> GraphProto.initializer -> TensorProto.raw_data) and
returns a small skeleton in which each large initializer is marked as external data, plus where
its bytes are; the session gets the skeleton and, through SessionOptions.add_external_initializers,
numpy views of the weight memory for those initializers. The views must outlive the session
(LoadedModel keeps them, and frees the weight memory only after the session).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

_MIN_EXTERNAL_BYTES = 64 << 10  # smaller initializers stay in the skeleton (copying them is cheap)
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_LEN, _VARINT = 2, 0
# ONNX TensorProto.DataType -> numpy (types ORT takes from numpy; others stay in the skeleton)
_NUMPY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


class WireError(ValueError):
    """The bytes are not a protobuf message this walker can follow."""


@dataclass(frozen=True)
class External:
    name: str
    dtype: type
    dims: tuple[int, ...]
    offset: int  # of its raw bytes in the model
    nbytes: int


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while i < end and shift < 70:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i
    raise WireError("truncated or overlong varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


def _fields(buf: memoryview, i: int, end: int):
    """(field number, wire type, field start, value start, value end) of each field in buf[i:end]."""
    while i < end:
        start = i
        tag, i = _varint(buf, i, end)
        wire = tag & 7
        if wire == _VARINT:
            value_start = i
            _, i = _varint(buf, i, end)
        elif wire == 1 or wire == 5:
            value_start, i = i, i + (8 if wire == 1 else 4)
        elif wire == _LEN:
            length, value_start = _varint(buf, i, end)
            i = value_start + length
        else:
            raise WireError(f"unsupported wire type {wire}")
        if i > end:
            raise WireError("a field runs past its message")
        yield tag >> 3, wire, start, value_start, i


def _len_field(number: int, body: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(body)) + body


def _entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto field of TensorProto.external_data."""
    return _len_field(_TENSOR_EXTERNAL_DATA, _len_field(1, key.encode()) + _len_field(2, value.encode()))


def _tensor(buf: memoryview, start: int, end: int, externals: list[External]) -> bytes:
    name, data_type, dims, raw = "", 0, [], None
    for number, wire, _, value_start, value_end in _fields(buf, start, end):
        if number == _TENSOR_NAME and wire == _LEN:
            name = bytes(buf[value_start:value_end]).decode("utf-8", "replace")
        elif number == _TENSOR_TYPE and wire == _VARINT:
            data_type = _varint(buf, value_start, value_end)[0]
        elif number == _TENSOR_DIMS and wire == _VARINT:
            dims.append(_varint(buf, value_start, value_end)[0])
        elif number == _TENSOR_DIMS and wire == _LEN:  # packed
            i = value_start
            while i < value_end:
                dim, i = _varint(buf, i, value_end)
                dims.append(dim)
        elif number == _TENSOR_RAW and wire == _LEN:
            raw = (value_start, value_end - value_start)
    dtype = _NUMPY.get(data_type)
    whole = bytes(buf[start:end])
    if raw is None or raw[1] < _MIN_EXTERNAL_BYTES or dtype is None or not name \
            or int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize != raw[1]:
        return whole
    externals.append(External(name, dtype, tuple(dims), raw[0], raw[1]))
    kept = b"".join(bytes(buf[s:e]) for number, _, s, _, e in _fields(buf, start, end) if number != _TENSOR_RAW)
    return (kept + _entry("location", "aclserve-weight-memory") + _entry("length", str(raw[1]))
            + _encode_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _encode_varint(1))


def _graph(buf: memoryview, start: int, end: int, externals: list[External]) -> bytes:
    parts = []
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if number == _GRAPH_INITIALIZER and wire == _LEN:
            parts.append(_len_field(number, _tensor(buf, value_start, value_end, externals)))
        else:
            parts.append(bytes(buf[field_start:value_end]))
    return b"".join(parts)


def split(model: memoryview) -> tuple[bytes, list[External]]:
    """(skeleton, its external initializers) of the ONNX model in `model`; WireError when the
    bytes are not a protobuf message (ORT, given them whole, then says what is wrong)."""
    parts, externals = [], []
    for number, wire, field_start, value_start, value_end in _fields(model, 0, len(model)):
        if number == _MODEL_GRAPH and wire == _LEN:
            parts.append(_len_field(number, _graph(model, value_start, value_end, externals)))
        else:
            parts.append(bytes(model[field_start:value_end]))
    return b"".join(parts), externals


def session(ptr: int, length: int, options, make):
    """(session, what must outlive it): `make(model_bytes, options)` builds the session from the
    skeleton of the model at [ptr, ptr+length), its large initializers views of that memory."""
    import onnxruntime as ort  # deferred, as in _model

    memory = memoryview((ctypes.c_char * length).from_address(ptr)).cast("B")
    try:
        skeleton, externals = split(memory)
    except WireError:
        return make(ctypes.string_at(ptr, length), options), ()
    if not externals:
        return make(skeleton, options), ()
    arrays = [np.frombuffer(memory, dtype=e.dtype, count=e.nbytes // np.dtype(e.dtype).itemsize,
                            offset=e.offset).reshape(e.dims) for e in externals]
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    options.add_external_initializers([e.name for e in externals], values)
    return make(skeleton, options), (memory, arrays, values)
