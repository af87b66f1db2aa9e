"""KServe v2 infer request codec: pure functions over bytes (no aiohttp, no I/O).

Decoding validates everything the model can check before queueing (names, datatypes, shapes,
batch rows, payload sizes) and raises errors.InvalidInput naming the field. Binary tensors are
zero-copy views (`np.frombuffer`, read-only) into the request body; the JSON part is parsed
with orjson under the request's JsonLimits (json_limits.py) and JSON tensors are converted by json_tensors.py.
Responses are rendered by `encode.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, NoReturn, Sequence

import numpy as np

from ..errors import InvalidInput, MalformedRequest, ServeError
from ..input_refusals import (CLASSIFIABLE, MAX_CLASSIFICATION_ENTRIES, bool_bytes_refused, classification_refused,
                              missing_inputs, no_rows, rows_differ, shape_refused, unknown_input, unknown_output)
from ..quoting import quoted
from ..runtime.types import TensorSpec
from .binary_data import HEADER_LENGTH, check_binary_data_fits, check_binary_data_size
from .bytes_codec import MAX_QUOTED_DIMS, decode_input as decode_bytes_input, raw_input as raw_bytes_input
from .json_simd import JsonNumbers
from .json_limits import JsonLimits
from .json_tensors import (AFTER_JSON, NOT_JSON, loads, numbers_in_json, read_numbers, refuse_booleans_among_numbers,
                           to_array)
from .parameters import json_unsigned, refuse_compound_values, refuse_shared_memory
from .single_header import single_value
from .stray_pictures import IMAGE_INPUT_HINT, refuse_picture
from .values import check_values

# model shapes of no dimension but the batch ([N], a static scalar []): a request may add a trailing
# 1, as the metadata and /config give them (model_info.py) and Triton takes them
ONE_ELEMENT_ROWS = ((), (-1,))


class Signature:
    """A model version's tensors indexed for decoding, with the JSON limits its requests are
    decoded under; built once per served version."""

    __slots__ = ("inputs", "outputs", "output_list", "max_batch_size", "json_limits", "labels",
                 "output_rows", "all_outputs", "value_ranges")

    def __init__(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], max_batch_size: int,
                 json_limits: JsonLimits = JsonLimits(), labels: dict[str, tuple[str, ...]] | None = None,
                 value_ranges: Mapping | None = None):
        self.labels = labels or {}  # output name -> class labels (classification answers)
        self.value_ranges = value_ranges or {}  # integer input name -> the values it takes (values.py)
        self.inputs = {s.name: s for s in inputs}
        self.outputs = {s.name: s for s in outputs}
        self.output_list = tuple(outputs)
        # name -> (batched, values a row, bytes a value): what an answer holds (answer_size.py);
        # a dimension the model leaves open counts as 1
        self.output_rows = {s.name: (s.batched, math.prod(max(d, 1) for d in s.sample_shape), s.dtype.itemsize)
                            for s in outputs}
        # all outputs together, for a request that names none: (bytes a row, values a row,
        # bytes, values) of the batched ones, then of the others
        rows = self.output_rows.values()
        self.all_outputs = (sum(v * size for b, v, size in rows if b), sum(v for b, v, _ in rows if b),
                            sum(v * size for b, v, size in rows if not b), sum(v for b, v, _ in rows if not b))
        self.max_batch_size = max_batch_size
        self.json_limits = json_limits


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: follow the request's binary_data_output
    classification: int = 0  # top-N classes as "value:index" strings; 0 = raw tensor


@dataclass(slots=True)
class InferRequest:
    inputs: dict[str, np.ndarray]
    rows: int  # batch rows of a batching model; 1 for a static model
    id: str | None = None
    priority: int | None = None
    timeout_us: int | None = None
    outputs: tuple[RequestedOutput, ...] | None = None  # None: every output
    binary_output: bool = False


def parse_header_length(values: Sequence[str]) -> int | None:
    """The header's value, from every occurrence of it (two could frame the body two ways, so
    they are refused): ASCII digits only (int() would also take "+5", "1_0", "-0", which means
    raw binary, and Unicode digits), at most 18 of them (beyond any body)."""
    value = single_value(HEADER_LENGTH, values)
    if value is None:
        return None
    digits = value.strip(" \t")
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer, got {value[:40]!r}")
    if len(digits.lstrip("0")) > 18:
        raise InvalidInput(f"{HEADER_LENGTH} {value[:40]!r} is larger than any body")
    return int(digits)


def check_header_length(header_length: int, body_length: int) -> None:
    """InvalidInput when the header gives the JSON part more bytes than the body has (decode_request,
    and an `Expect: 100-continue` from the body's Content-Length: infer.expect_body)."""
    if header_length > body_length:
        raise MalformedRequest(f"{HEADER_LENGTH} is {header_length} but the body has only {body_length} bytes")


def decode_request(body: bytes, header_length: int | None, sig: Signature) -> InferRequest:
    """Decode one infer request body. `header_length` is the Inference-Header-Content-Length
    value (None when absent: the whole body is JSON; 0: raw binary for a single-input model)."""
    if header_length == 0:
        return _decode_raw(body, sig)
    end = len(body)
    if header_length is not None:
        check_header_length(header_length, end)
        end = header_length
    text = body if end == len(body) else memoryview(body)[:end]
    try:
        doc = loads(text, sig.json_limits)
    except InvalidInput as e:
        why = str(e).removeprefix(NOT_JSON)
        # the header is in doubt where it cuts the body, or where it spans it and the JSON is
        # followed by more (the binary part swallowed: the header given the body's length)
        if header_length is None or why == str(e) or (end == len(body) and not why.startswith(AFTER_JSON)):
            raise MalformedRequest(e.message) from None
        # a header off by a few bytes (a hand-made client's usual mistake) cuts or overruns the JSON
        raise MalformedRequest(f"the JSON part of the body (its first {end} bytes, as {HEADER_LENGTH} gives) is not "
                           f"valid JSON: {why}; the header is the JSON's length in bytes, UTF-8 encoded") from None
    if type(doc) is not dict:
        raise MalformedRequest("request body must be a JSON object")
    req = InferRequest(inputs={}, rows=1)
    rid = doc.get("id")
    if rid is not None:
        if type(rid) is not str:
            raise InvalidInput("id must be a string")
        req.id = rid
    try:
        _decode_inputs(doc.get("inputs"), body, end, header_length is not None, sig, req)
        numeric = numbers_in_json(doc, sig.inputs)
        if numeric:  # binary tensors hold no JSON booleans
            refuse_booleans_among_numbers(doc, text, numeric)
        params = doc.get("parameters")
        if params is not None:  # (not `if params`: 0, false or "" were taken for none)
            _decode_parameters(params, req, text)
        outs = doc.get("outputs")
        if outs is not None and (outs or type(outs) is not list):  # [] asks for every output
            req.outputs = _decode_outputs(outs, sig)
            check_classification(req, sig)
    except ServeError as e:
        e.request_id = rid  # the request log and traces name the request refused
        raise
    return req


def _decode_inputs(items, body: bytes, offset: int, framed: bool, sig: Signature, req: InferRequest) -> None:
    if type(items) is not list or not items:
        raise InvalidInput("inputs must be a non-empty array")
    arrays = req.inputs
    rows = None
    for i, item in enumerate(items):
        if type(item) is not dict:
            raise InvalidInput(f"inputs[{i}] must be an object")
        name = item.get("name")
        spec = sig.inputs.get(name) if type(name) is str else None
        if spec is None:
            if type(name) is not str:
                raise InvalidInput(f"inputs[{i}].name must be a string")
            raise InvalidInput(unknown_input(name, sig.inputs))
        if name in arrays:
            raise InvalidInput(f"input '{name}' is given more than once")
        datatype = item.get("datatype")
        if datatype == "BYTES" == spec.datatype:  # encoded images: framing and shape rules in bytes_codec
            arrays[name], offset, rows = decode_bytes_input(name, item, spec, sig.max_batch_size, rows,
                                                            body, offset, framed)
            continue
        count, rows, shape = check_input(name, datatype, item.get("shape"), spec, sig, rows)
        params = item.get("parameters")
        size = None
        if params is not None:
            if type(params) is not dict:
                raise InvalidInput(f"input '{name}': parameters must be an object")
            refuse_shared_memory(params, f"input '{name}'")
            refuse_compound_values(params, f"input '{name}'")
            size = params.get("binary_data_size")
        if size is not None:
            check_binary_data_size(name, item, size, framed)
            refuse_picture(name, body, spec, offset=offset)  # (whatever its size: it says what was sent)
            expected = count * spec.dtype.itemsize
            if size != expected:
                raise InvalidInput(f"input '{name}': binary_data_size {size} does not match shape {shape} "
                                   f"of {datatype} ({expected} bytes)")
            check_binary_data_fits(name, size, body, offset)
            arrays[name] = tensor_view(name, body, spec, count, shape, offset)
            offset += size
        else:
            data = item.get("data")
            if data is None:
                raise InvalidInput(f"input '{name}' has neither data nor parameters.binary_data_size")
            if type(data) is JsonNumbers:  # still in simdjson's document (json_simd.py)
                arr = read_numbers(name, data, spec, shape, count)
                if arr is not None:
                    arrays[name] = arr
                    continue
                data = item["data"] = data.as_list()
            arrays[name] = to_array(name, data, spec, shape, count)
    if offset != len(body):
        raise InvalidInput(f"body has {len(body) - offset} bytes after the last binary input "
                           f"(binary_data_size values do not add up)")
    check_complete(arrays, sig)
    check_values(arrays, sig.value_ranges)
    req.rows = rows if rows is not None else 1


def check_input(name: str, datatype, shape, spec: TensorSpec, sig: Signature, rows: int | None
                ) -> tuple[int, int | None, list]:
    """Datatype, shape and batch rows of input `name` against the model (shared with the gRPC
    codec). Returns (element count, the request's batch rows so far, the shape in the model's
    rank: a tensor of no dimension but the batch may come as its metadata and /config give it,
    Triton's way, with a trailing 1: `dims: [1]` and `reshape: []`)."""
    if datatype != spec.datatype:
        if datatype is None or datatype == "":
            raise InvalidInput(f"input '{name}': datatype is missing (the model expects {spec.datatype})")
        if datatype == "BYTES":
            raise InvalidInput(f"input '{name}': datatype BYTES is not supported here (the model expects "
                               f"{spec.datatype}; {IMAGE_INPUT_HINT})")
        hint = " (an image input: it takes JPEG or PNG files, each one element)" if spec.datatype == "BYTES" else ""
        raise InvalidInput(f"input '{name}': datatype {quoted(datatype)} does not match the model's {spec.datatype}"
                           + hint)
    if type(shape) is list and len(shape) == len(spec.shape) + 1 and shape[-1] == 1 and spec.shape in ONE_ELEMENT_ROWS:
        shape = shape[:-1]  # [N, 1] for [N], [1] for a scalar: model_info.py writes them so
    count = _check_shape(name, shape, spec)
    if spec.batched and sig.max_batch_size:
        r = shape[0]
        if r < 1:
            raise InvalidInput(no_rows(name))
        if r > sig.max_batch_size:
            raise InvalidInput(f"input '{name}': batch size {r} exceeds the model's max_batch_size "
                               f"{sig.max_batch_size}")
        if rows is None:
            rows = r
        elif r != rows:
            raise InvalidInput(rows_differ(name, r, rows))
    return count, rows, shape


def tensor_view(name: str, buffer, spec: TensorSpec, count: int, shape, offset: int = 0) -> np.ndarray:
    """Binary tensor data as a read-only view of the body (no copy). BOOL elements must be bytes
    0 or 1 (input_refusals.bool_bytes_refused: Engine refuses them in the same words)."""
    arr = np.frombuffer(buffer, spec.dtype, count, offset)
    refusal = bool_bytes_refused(name, arr)
    if refusal is not None:
        raise InvalidInput(refusal)
    return arr.reshape(shape)


def check_complete(arrays: dict, sig: Signature) -> None:
    if len(arrays) != len(sig.inputs):
        missing = [n for n in sig.inputs if n not in arrays]
        raise InvalidInput(missing_inputs(missing))


def _check_shape(name: str, shape, spec: TensorSpec) -> int:
    """Validate a request shape against the spec (-1 matches any size); return the element count."""
    want = spec.shape
    if type(shape) is list and len(shape) == len(want):  # the usual case, in one pass
        count = 1
        for got, wanted in zip(shape, want):
            if type(got) is not int or got < 0 or (wanted != -1 and got != wanted):
                break
            count *= got
        else:
            return count
    return _shape_refused(name, shape, want)


def _shape_refused(name: str, shape, want: tuple[int, ...]) -> NoReturn:
    """What is wrong with a shape _check_shape did not accept: raises InvalidInput."""
    if type(shape) is list:
        check_rank(name, len(shape), want)
    if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape must be an array of non-negative integers")
    raise InvalidInput(shape_refused(name, shape, want, [*want, 1] if want in ONE_ELEMENT_ROWS else None))


def check_rank(name: str, rank: int, want: Sequence[int]) -> None:
    """Refuse a shape of more than MAX_QUOTED_DIMS dimensions (and more than the model's) by its
    length alone, before its values are read (shared with the gRPC codec)."""
    if rank > max(MAX_QUOTED_DIMS, len(want)):
        raise InvalidInput(f"input '{name}': shape has {rank:,} dimensions; the model's {list(want)} has {len(want)}")


def _decode_raw(body: bytes, sig: Signature) -> InferRequest:
    if len(sig.inputs) != 1:
        raise InvalidInput(f"a raw binary request ({HEADER_LENGTH}: 0) needs a single-input model; "
                           f"this one has {len(sig.inputs)} inputs")
    spec = next(iter(sig.inputs.values()))
    if spec.datatype == "BYTES":
        return InferRequest(inputs={spec.name: raw_bytes_input(spec, body)}, rows=1, binary_output=True)
    refuse_picture(spec.name, body, spec, "the raw binary body")  # whether or not its size fits
    shape = list(spec.shape)
    if spec.batched and sig.max_batch_size:
        shape[0] = 1
    itemsize = spec.dtype.itemsize
    if len(body) % itemsize:
        raise InvalidInput(f"raw binary body of {len(body)} bytes is not a whole number of {spec.datatype}")
    count = len(body) // itemsize
    variable = [i for i, d in enumerate(shape) if d == -1]
    known = math.prod(d for d in shape if d != -1)
    if len(variable) > 1:
        raise InvalidInput(f"raw binary request: input '{spec.name}' has more than one variable dimension")
    if variable and known and count % known == 0:
        shape[variable[0]] = count // known
    if math.prod(shape) != count or -1 in shape:
        raise InvalidInput(f"raw binary body of {len(body)} bytes does not fit input '{spec.name}' "
                           f"of shape {list(spec.shape)} ({spec.datatype}){_one_row(spec, shape, len(body), sig)}")
    arr = tensor_view(spec.name, body, spec, count, shape)
    check_values({spec.name: arr}, sig.value_ranges)
    return InferRequest(inputs={spec.name: arr}, rows=1, binary_output=True)


def _one_row(spec, shape: list[int], size: int, sig: Signature) -> str:
    """A raw body is one row of a batched input (no header gives more): its size, and how to send several."""
    if not (spec.batched and sig.max_batch_size):
        return ""
    row, open_dim = math.prod(d for d in shape if d != -1) * spec.dtype.itemsize, -1 in shape
    several = str([size // row if size % row == 0 and not open_dim else 2, *spec.shape[1:]]).replace("-1", "<length>")
    return (f": a raw body is one row, {'a multiple of ' if open_dim else ''}{row} bytes for this input; send "
            f"several rows with the binary data extension, a JSON header giving the input's shape (e.g. {several}) "
            f"and binary_data_size, its length in {HEADER_LENGTH}")


def _decode_parameters(params, req: InferRequest, text) -> None:
    """`text`: the request's JSON, where a refused value is quoted from (json_unsigned)."""
    if type(params) is not dict:
        raise InvalidInput("parameters must be an object")
    req.priority = json_unsigned(params, "priority", text)
    req.timeout_us = json_unsigned(params, "timeout", text)
    binary = params.get("binary_data_output")
    if binary is not None:
        if type(binary) is not bool:
            raise InvalidInput("parameters.binary_data_output must be a boolean")
        req.binary_output = binary
    seq = params.get("sequence_id")
    if seq not in (None, 0, ""):
        raise InvalidInput("parameters.sequence_id: sequence batching is not supported")
    refuse_compound_values(params)


def _decode_outputs(items, sig: Signature) -> tuple[RequestedOutput, ...]:
    if type(items) is not list:
        raise InvalidInput("outputs must be an array")
    result = []
    seen = set()
    for i, item in enumerate(items):
        if type(item) is not dict or type(item.get("name")) is not str:
            raise InvalidInput(f"outputs[{i}] must be an object with a string name")
        name = item["name"]
        if name not in sig.outputs:
            raise InvalidInput(unknown_output(name, sig.outputs))
        if name in seen:
            raise InvalidInput(f"output '{name}' is requested more than once")
        seen.add(name)
        params = item.get("parameters")
        params = {} if params is None else params
        if type(params) is not dict:
            raise InvalidInput(f"output '{name}': parameters must be an object")
        refuse_shared_memory(params, f"output '{name}'")
        refuse_compound_values(params, f"output '{name}'")
        binary = params.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise InvalidInput(f"output '{name}': parameters.binary_data must be a boolean")
        classes = params.get("classification")
        classes = 0 if classes is None else classes  # null: none, as null is for the other parameters
        if type(classes) is not int or classes < 0:
            raise InvalidInput(f"output '{name}': parameters.classification must be a non-negative integer")
        result.append(RequestedOutput(name, binary, classes))
    return tuple(result)


def check_classification(req: InferRequest, sig: Signature) -> None:
    """Refuse classification of an output whose datatype is not CLASSIFIABLE, and answers of more
    than MAX_CLASSIFICATION_ENTRIES strings in all (a top-N of rows x min(N, values per row) per
    output, as encode.classify renders it), before the request is queued (shared with the gRPC
    codec)."""
    entries = 0
    for out in req.outputs or ():
        if out.classification:
            spec = sig.outputs[out.name]
            if spec.datatype not in CLASSIFIABLE:
                raise InvalidInput(classification_refused(out.name, spec.datatype))
            by_row = spec.batched and sig.max_batch_size
            dims = spec.shape[1:] if by_row else spec.shape
            per_row = math.prod(dims) if all(d >= 0 for d in dims) else out.classification
            entries += (req.rows if by_row else 1) * min(out.classification, per_row)
            if entries > MAX_CLASSIFICATION_ENTRIES:
                raise InvalidInput(f"output '{out.name}': parameters.classification {out.classification} asks for "
                                   f"{entries:,} class strings in all; at most {MAX_CLASSIFICATION_ENTRIES:,} "
                                   f"per request (ask for fewer classes or rows)")
