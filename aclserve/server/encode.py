"""KServe v2 infer response rendering (no aiohttp, no I/O).

Outputs go JSON (the array written by orjson, see json_tensors.py; non-finite values as null,
counted in the output's `non_finite_values` parameter) or binary (the array's own buffer joined
after the JSON header) per requested output's `binary_data`, else the request's
`binary_data_output`. The JSON of a large answer is written a slice of values at a time, the
event loop given its turn between slices (json_slices.py).
"""
from __future__ import annotations

from collections.abc import Coroutine

import numpy as np

from .codec import InferRequest, Signature
from .json_slices import SLICE_VALUES, dumps_sliced
from .json_tensors import dumps_response, output_entry

Encoded = tuple[bytes | bytearray, int | None]


def encode_response(model_name: str, model_version: str, req: InferRequest,
                    outputs: dict[str, np.ndarray], sig: Signature, batched: bool
                    ) -> Encoded | Coroutine[None, None, Encoded]:
    """Render the outputs; returns (body, json_length) where json_length is the value for the
    Inference-Header-Content-Length header, or None for an all-JSON body. When the JSON outputs
    hold more than json_slices.SLICE_VALUES values, a coroutine of it instead, which gives the
    event loop its turns while it writes them (its body a bytearray then; cancelled at a turn
    when the client goes): a small answer is made without one, at no cost more."""
    if req.outputs is None:
        selected = [(s.name, s.datatype, req.binary_output, 0) for s in sig.output_list]
    else:
        default = req.binary_output
        selected = [(o.name, sig.outputs[o.name].datatype, default if o.binary is None else o.binary,
                     o.classification) for o in req.outputs]
    entries = []
    chunks = []
    json_values = 0
    for name, datatype, binary, classes in selected:
        arr = outputs[name]
        if classes:
            arr = classify(arr, classes, batched, sig.labels.get(name))
            datatype = "BYTES"
        if binary:
            if datatype == "BYTES":
                raw = b"".join(len(s).to_bytes(4, "little") + s for s in (x.encode() for x in arr.ravel()))
            else:
                raw = np.ascontiguousarray(arr)
            entries.append({"name": name, "datatype": datatype, "shape": list(arr.shape),
                            "parameters": {"binary_data_size": len(raw) if datatype == "BYTES" else arr.nbytes}})
            chunks.append(raw)
        else:
            entries.append(output_entry(name, datatype, arr))
            json_values += arr.size
    doc = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if req.id:  # (an empty one is left out, as Triton does)
        doc["id"] = req.id
    if json_values > SLICE_VALUES:
        return _sliced(doc, chunks)
    return _body(dumps_response(doc), chunks)


async def _sliced(doc: dict, chunks: list) -> Encoded:
    return _body(await dumps_sliced(doc), chunks)


def _body(head: bytes | bytearray, chunks: list) -> Encoded:
    """(the body, its JSON part's length), or (the JSON, None) for an answer all JSON."""
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def classify(arr: np.ndarray, classes: int, batched: bool, labels: tuple[str, ...] | None = None) -> np.ndarray:
    """Top-`classes` entries as "value:index" strings ("value:index:label" with labels; a class
    with no label or an empty one: "value:index", as Triton writes it), per batch row when
    `batched`; ties in index order. Integer values are written as integers and
    ranked in their own type (through float64, 2**64 - 1 and 2**64 - 2 were one value), floats
    with six decimals, as Triton does."""
    rows = arr.reshape(arr.shape[0], -1) if batched and arr.ndim > 0 else arr.reshape(1, -1)
    n = min(classes, rows.shape[1])
    integer = rows.dtype.kind in "iu"
    descending = ~rows if integer else -rows.astype(np.float64)  # ~x reverses an integer order, never overflows
    top = np.argsort(descending, axis=1, kind="stable")[:, :n]
    names = labels or ()
    value = (lambda v: f"{int(v)}") if integer else (lambda v: f"{float(v):f}")
    out = np.array([[f"{value(row[j])}:{j}" + (f":{names[j]}" if j < len(names) and names[j] else "") for j in idx]
                    for row, idx in zip(rows, top)], dtype=object)
    return out if batched else out.reshape(n)
