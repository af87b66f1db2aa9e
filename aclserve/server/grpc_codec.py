"""KServe v2 gRPC infer codec: ModelInferRequest -> InferRequest, outputs -> ModelInferResponse,
and a stream's responses (marked final; an error's named after its request).

Pure functions over the protobuf messages (no grpc, no I/O). Inputs are validated with the
same checks as the HTTP codec (codec.check_input: names, datatypes, shapes, batch rows) and
raise errors.InvalidInput naming the field; an input of more packed values than decoding takes
is refused from the message's wire layout, with the same checks and words, before protobuf
parses it (refuse_unparsed). `raw_input_contents` entries become zero-copy
read-only views (`np.frombuffer`) of the received message when the caller passes them as views
(grpc_wire.scan; the parsed message's own entries are a copy each); typed `contents` are read
with one `np.fromiter` (np.asarray on a repeated field first builds a Python float per element:
176 MiB at its peak for 16 MiB of fp32_contents, against the 16 MiB array). Outputs go
back as `raw_output_contents`, one entry per output in `outputs` order, which is what
`tritonclient.grpc`'s `as_numpy` reads.

The message classes are the ones `tritonclient[grpc]` ships, generated from Triton's
grpc_service.proto (see grpc_service.py for why).
"""
from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidInput
from ..input_refusals import unknown_input, unknown_output
from ..quoting import quoted, quoted_name
from ..runtime.types import TensorSpec
from .bytes_codec import MAX_QUOTED_DIMS, grpc_input as decode_bytes_input, no_grpc_data
from .codec import (InferRequest, RequestedOutput, Signature, check_classification, check_complete, check_input,
                    check_rank, tensor_view)
from .encode import classify
from .grpc_wire import InputLayout, Layout, names, whole
from .parameters import refuse_shared_memory
from .stray_pictures import refuse_picture
from .values import check_values

# KServe datatype -> (InferTensorContents field, numpy type of that field's elements)
CONTENTS_FIELDS = {
    "BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int32),
    "INT16": ("int_contents", np.int32), "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64), "UINT8": ("uint_contents", np.uint32),
    "UINT16": ("uint_contents", np.uint32), "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64), "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
}
CONTENTS_NAMES = {number: field.name for number, field in pb.InferTensorContents.DESCRIPTOR.fields_by_number.items()}
# typed contents varints past which an input's contents are checked from the wire, before the
# parse (refuse_unparsed): protobuf parses a varint in 30-90 ns, this many in about a millisecond
UNPARSED_VARINTS = 16 * 1024
# a message whose one input's name is not UTF-8: refused as protobuf refuses it
NOT_UTF8_INPUT = b"\x2a\x03\x0a\x01\xff"


def parsed(message: bytes) -> pb.ModelInferRequest:
    try:
        return pb.ModelInferRequest.FromString(message)
    except DecodeError as e:
        raise InvalidInput(f"request message is not a valid ModelInferRequest: {e}") from None


def refuse_unparsed(layout: Layout, sig: Signature) -> None:
    """Refuse, before protobuf parses its message, a request that holds more packed varints than
    decoding takes (read by grpc_wire.scan, not decoded): a shape of more dimensions than
    check_rank allows, or typed contents of over UNPARSED_VARINTS elements that are not what
    their input's shape needs (8 MB of either took the parse 0.24-0.77 s of the event loop, to be
    refused once parsed). The inputs are checked in order as decode_infer_request checks them,
    with its words: names and ranks, and an input of that many contents as decoding checks its
    contents (not the batch rows of the inputs before it, nor its parameters). A request with
    another fault besides, which decoding would meet first, may hear of this one instead."""
    if layout.most_dims <= MAX_QUOTED_DIMS and layout.most_varints <= UNPARSED_VARINTS:
        return
    seen = set()
    for tensor in layout.inputs(len(sig.inputs) + 1):  # as decoding reads them: the last is unknown or given twice
        name = _text(tensor.name)
        spec = _input_spec(name, tensor.dims, sig, seen)
        if tensor.varints > UNPARSED_VARINTS:
            _check_contents(name, tensor, spec, sig, bool(layout.raw_contents))
        seen.add(name)


def _check_contents(name: str, tensor: InputLayout, spec: TensorSpec, sig: Signature, raw: bool) -> None:
    """decode_infer_request's checks of an input's contents, from its wire layout."""
    if raw and tensor.has_contents:
        raise _mixed(name)
    held = [(CONTENTS_NAMES[number], elements) for number, elements in sorted(tensor.contents.items()) if elements]
    datatype = _text(tensor.datatype)
    if datatype == "BYTES" == spec.datatype:
        _only_field(name, held, "bytes_contents", spec.datatype)  # (its varints are in another)
    count, _, shape = check_input(name, datatype, tensor.shape(), spec, sig, None)
    _contents_field(name, held, spec, shape, count)


def _text(utf8) -> str:
    """A string field's bytes decoded, as protobuf parses them ("" when absent): refused in its words
    when they are not UTF-8."""
    text = whole(utf8)
    if text is None:
        parsed(NOT_UTF8_INPUT)  # (a protobuf taking it: as it would read it)
        text = str(utf8, "utf-8", "replace")
    return text


def contents_elements(msg: pb.ModelInferRequest, sig: Signature) -> int:
    """Typed-contents elements of a request (to decide whether decoding goes to a thread), in
    the inputs decoding reads: at most one more than the model has (decode_infer_request refuses
    an unknown or repeated input by then). Every input of the message took 0.3 us of the event
    loop each: 2,000,000 empty ones (4 MB) held it 0.6 s."""
    if msg.raw_input_contents:
        return 0
    total = 0
    inputs = msg.inputs
    for i in range(min(len(inputs), len(sig.inputs) + 1)):
        tensor = inputs[i]
        for _, values in tensor.contents.ListFields():
            total += len(values)
    return total


def decode_infer_request(msg: pb.ModelInferRequest, sig: Signature, raw_contents=None) -> InferRequest:
    """`raw_contents`: msg's raw_input_contents entries as views of the received message."""
    raw = msg.raw_input_contents if raw_contents is None else raw_contents
    if raw and len(raw) != len(msg.inputs):
        # a client mixing ways (an input in shared memory, for which Triton counts no entry, or in
        # typed contents) hears what it mixed, not the count that follows from it; of the inputs
        # decoding reads (at most one more than the model has: contents_elements)
        for tensor in msg.inputs[:len(sig.inputs) + 1]:
            _refuse_way(tensor, raw)
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs "
                           f"(one per input, in inputs order)")
    if not msg.inputs:
        raise InvalidInput("inputs must not be empty")
    req = InferRequest(inputs={}, rows=1, id=msg.id or None)
    arrays = req.inputs
    rows = None
    for i, tensor in enumerate(msg.inputs):
        name = tensor.name
        spec = _input_spec(name, len(tensor.shape), sig, arrays)
        shape = list(tensor.shape)
        _refuse_way(tensor, raw)
        if tensor.datatype == "BYTES" == spec.datatype:  # encoded images (bytes_codec)
            if not raw:
                _only_field(name, _held(tensor.contents), "bytes_contents", spec.datatype)
            arrays[name], rows = decode_bytes_input(name, shape, raw[i] if raw else None,
                                                    tensor.contents.bytes_contents, spec, sig.max_batch_size, rows)
            continue
        count, rows, shape = check_input(name, tensor.datatype, shape, spec, sig, rows)
        if raw:
            data = raw[i]
            refuse_picture(name, data, spec, f"raw_input_contents[{i}]")
            expected = count * spec.dtype.itemsize
            if len(data) != expected:
                raise InvalidInput(f"input '{name}': raw_input_contents[{i}] has {len(data)} bytes but shape "
                                   f"{shape} of {spec.datatype} needs {expected}")
            arrays[name] = tensor_view(name, data, spec, count, shape)
        else:
            arrays[name] = _from_contents(name, tensor.contents, spec, shape, count)
    check_complete(arrays, sig)
    check_values(arrays, sig.value_ranges)
    req.rows = rows if rows is not None else 1
    if msg.parameters:
        _decode_parameters(msg.parameters, req)
    if msg.outputs:
        req.outputs = _decode_outputs(msg.outputs, sig)
        check_classification(req, sig)
    return req


def _input_spec(name: str, rank: int, sig: Signature, seen) -> TensorSpec:
    """The model's spec of input `name`, of `rank` dimensions, not among those `seen` before."""
    spec = sig.inputs.get(name)
    if spec is None:
        raise InvalidInput(unknown_input(name, sig.inputs))
    if name in seen:
        raise InvalidInput(f"input '{name}' is given more than once")
    check_rank(name, rank, spec.shape)  # before a long one is listed
    return spec


def _refuse_way(tensor, raw) -> None:
    """Refuse an input sent in a way this server does not take: in shared memory, or in typed
    contents when the request uses raw_input_contents."""
    if tensor.parameters:
        refuse_shared_memory(tensor.parameters, f"input {quoted_name(tensor.name)}")
    if raw and tensor.HasField("contents"):
        raise _mixed(tensor.name)


def _mixed(name: str) -> InvalidInput:
    return InvalidInput(f"input {quoted_name(name)} has contents but the request uses raw_input_contents "
                        f"(use one or the other for every input)")


def _held(contents) -> list[tuple[str, int]]:
    """(field, elements) of each contents field holding any, in field order."""
    return [(field.name, len(values)) for field, values in contents.ListFields()]


def _only_field(name: str, held: list[tuple[str, int]], field: str, datatype: str) -> None:
    """Refuse typed contents in another field than `datatype`'s (they would be read as none)."""
    for other, elements in held:
        if other != field and elements:
            raise InvalidInput(f"input '{name}': contents.{other} given for {datatype} (expected contents.{field})")


def _contents_field(name: str, held: list[tuple[str, int]], spec: TensorSpec, shape: list[int], count: int) -> str:
    """The contents field that holds input `name`'s `count` elements, given what its fields
    hold (`held`): refused when there is none, it holds another count, or another holds any."""
    entry = CONTENTS_FIELDS.get(spec.datatype)
    if entry is None:
        raise InvalidInput(f"input '{name}': {spec.datatype} has no typed contents field; "
                           f"send it in raw_input_contents")
    field = entry[0]
    if count and not held:
        raise no_grpc_data(name, field)
    _only_field(name, held, field, spec.datatype)
    elements = dict(held).get(field, 0)
    if elements != count:
        raise InvalidInput(f"input '{name}': contents.{field} has {elements} elements but shape "
                           f"{shape} needs {count}")
    return field


def _from_contents(name: str, contents, spec, shape: list[int], count: int) -> np.ndarray:
    field = _contents_field(name, _held(contents), spec, shape, count)
    values = getattr(contents, field)
    arr = np.fromiter(values, dtype=CONTENTS_FIELDS[spec.datatype][1], count=count)
    if arr.dtype != spec.dtype:
        if count and spec.dtype.kind in "iu":
            info = np.iinfo(spec.dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise InvalidInput(f"input '{name}': contents values out of range for {spec.datatype}")
        arr = arr.astype(spec.dtype)
    return arr.reshape(shape)


def _uint_parameter(params, key: str, owner: str = "") -> int | None:
    """`owner` starts the message of a refusal ("output 'y': "), as HTTP names the output."""
    if key not in params:
        return None
    param = params[key]
    kind = param.WhichOneof("parameter_choice")
    if kind == "uint64_param":
        value = param.uint64_param
    elif kind == "int64_param" and param.int64_param >= 0:
        value = param.int64_param
    else:
        shown = f"{kind} {quoted(getattr(param, kind))}" if kind else "no value"
        raise InvalidInput(f"{owner}parameters.{key} must be a non-negative integer (int64_param or uint64_param), "
                           f"got {shown}")
    return value


def _decode_parameters(params, req: InferRequest) -> None:
    req.priority = _uint_parameter(params, "priority")
    req.timeout_us = _uint_parameter(params, "timeout")
    if "sequence_id" in params:
        seq = params["sequence_id"]
        kind = seq.WhichOneof("parameter_choice")
        if kind is not None and getattr(seq, kind) not in (0, "", False):
            raise InvalidInput("parameters.sequence_id: sequence batching is not supported")


def _decode_outputs(items, sig: Signature) -> tuple[RequestedOutput, ...]:
    result = []
    seen = set()
    for item in items:
        name = item.name
        if name not in sig.outputs:
            raise InvalidInput(unknown_output(name, sig.outputs))
        if name in seen:
            raise InvalidInput(f"output '{name}' is requested more than once")
        seen.add(name)
        classes = 0
        if item.parameters:
            refuse_shared_memory(item.parameters, f"output '{name}'")
            classes = _uint_parameter(item.parameters, "classification", f"output '{name}': ") or 0
        result.append(RequestedOutput(name, None, classes))
    return tuple(result)


def encode_infer_response(model_name: str, model_version: str, req: InferRequest,
                          outputs: dict[str, np.ndarray], sig: Signature, batched: bool) -> pb.ModelInferResponse:
    if req.outputs is None:
        selected = [(s.name, s.datatype, 0) for s in sig.output_list]
    else:
        selected = [(o.name, sig.outputs[o.name].datatype, o.classification) for o in req.outputs]
    tensors = []
    raw = []
    for name, datatype, classes in selected:
        arr = outputs[name]
        if classes:
            arr = classify(arr, classes, batched, sig.labels.get(name))
            datatype = "BYTES"
            raw.append(b"".join(len(s).to_bytes(4, "little") + s for s in (x.encode() for x in arr.ravel())))
        else:
            raw.append(np.ascontiguousarray(arr).tobytes())
        tensors.append(pb.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=arr.shape))
    return pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=req.id or "",
                                 outputs=tensors, raw_output_contents=raw)


def final_stream_response(response: pb.ModelStreamInferResponse) -> pb.ModelStreamInferResponse:
    """Mark a stream's response `triton_final_response`, as Triton marks each (clients that set
    triton_enable_empty_final_response wait for it): every model here answers a request once,
    so each response is its request's last and no empty one follows."""
    response.infer_response.parameters["triton_final_response"].bool_param = True
    return response


def stream_error_response(message: bytes, error: str) -> pb.ModelStreamInferResponse:
    """The error answer of a streamed request, named as far as its message can be read (it may
    have been refused before it was parsed)."""
    name, version, ident = names(message)
    return pb.ModelStreamInferResponse(
        error_message=error, infer_response=pb.ModelInferResponse(model_name=name, model_version=version, id=ident))
