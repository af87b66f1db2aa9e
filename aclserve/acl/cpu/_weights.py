"""Build an ONNX Runtime session from an ONNX model held in device (weight) memory, without copies.

ORT takes a model as Python bytes only, and copies them again into a std::string and a protobuf
before making its own tensors: from the weight memory that was four copies of the weights at once.
Instead the model's large initializers stay where they are: `split` walks the protobuf wire format
of the model in place (protobuf_wire.py; ModelProto.graph -> GraphProto.initializer ->
TensorProto.raw_data) and returns a small skeleton in which each large initializer is marked as
external data, plus where its bytes are; the session gets the skeleton and, through
SessionOptions.add_external_initializers, numpy views of the weight memory for those initializers.
The views must outlive the session (LoadedModel keeps them, and frees the weight memory only after
the session).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ...protobuf_wire import LEN, VARINT, WireError, fields, len_field, varint, varint_field

_MIN_EXTERNAL_BYTES = 64 << 10  # smaller initializers stay in the skeleton (copying them is cheap)
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
# ONNX TensorProto.DataType -> numpy (types ORT takes from numpy; others stay in the skeleton)
_NUMPY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


@dataclass(frozen=True)
class External:
    name: str
    dtype: type
    dims: tuple[int, ...]
    offset: int  # of its raw bytes in the model
    nbytes: int


def _entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto field of TensorProto.external_data."""
    return len_field(_TENSOR_EXTERNAL_DATA, len_field(1, key.encode()) + len_field(2, value.encode()))


def _tensor(buf: memoryview, start: int, end: int, externals: list[External]) -> bytes:
    name, data_type, dims, raw = "", 0, [], None
    for number, wire, _, value_start, value_end in fields(buf, start, end):
        if number == _TENSOR_NAME and wire == LEN:
            name = bytes(buf[value_start:value_end]).decode("utf-8", "replace")
        elif number == _TENSOR_TYPE and wire == VARINT:
            data_type = varint(buf, value_start, value_end)[0]
        elif number == _TENSOR_DIMS and wire == VARINT:
            dims.append(varint(buf, value_start, value_end)[0])
        elif number == _TENSOR_DIMS and wire == LEN:  # packed
            i = value_start
            while i < value_end:
                dim, i = varint(buf, i, value_end)
                dims.append(dim)
        elif number == _TENSOR_RAW and wire == LEN:
            raw = (value_start, value_end - value_start)
    dtype = _NUMPY.get(data_type)
    whole = bytes(buf[start:end])
    if raw is None or raw[1] < _MIN_EXTERNAL_BYTES or dtype is None or not name \
            or int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize != raw[1]:
        return whole
    externals.append(External(name, dtype, tuple(dims), raw[0], raw[1]))
    kept = b"".join(bytes(buf[s:e]) for number, _, s, _, e in fields(buf, start, end) if number != _TENSOR_RAW)
    return (kept + _entry("location", "aclserve-weight-memory") + _entry("length", str(raw[1]))
            + varint_field(_TENSOR_DATA_LOCATION, 1))


def _graph(buf: memoryview, start: int, end: int, externals: list[External]) -> bytes:
    parts = []
    for number, wire, field_start, value_start, value_end in fields(buf, start, end):
        if number == _GRAPH_INITIALIZER and wire == LEN:
            parts.append(len_field(number, _tensor(buf, value_start, value_end, externals)))
        else:
            parts.append(bytes(buf[field_start:value_end]))
    return b"".join(parts)


def split(model: memoryview) -> tuple[bytes, list[External]]:
    """(skeleton, its external initializers) of the ONNX model in `model`; WireError when the
    bytes are not a protobuf message (ORT, given them whole, then says what is wrong)."""
    parts, externals = [], []
    for number, wire, field_start, value_start, value_end in fields(model, 0, len(model)):
        if number == _MODEL_GRAPH and wire == LEN:
            parts.append(len_field(number, _graph(model, value_start, value_end, externals)))
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
