"""KServe v2 infer response rendering: pure functions (no aiohttp, no I/O).

Outputs go JSON (`arr.tolist()` + one json encode) or binary (the array's own buffer joined
after the JSON header) per requested output's `binary_data`, else the request's
`binary_data_output`. The caller moves big JSON renderings to a thread
(see codec.JSON_OFFLOAD_ELEMENTS).
"""
from __future__ import annotations

import json

import numpy as np

from .codec import InferRequest, Signature

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def json_output_elements(req: InferRequest, outputs: dict[str, np.ndarray]) -> int:
    """Upper bound of the elements a response would render as JSON (to decide on a thread)."""
    if req.outputs is None:
        return 0 if req.binary_output else sum(a.size for a in outputs.values())
    return sum(outputs[o.name].size for o in req.outputs
               if not (o.binary if o.binary is not None else req.binary_output))


def encode_response(model_name: str, model_version: str, req: InferRequest,
                    outputs: dict[str, np.ndarray], sig: Signature, batched: bool
                    ) -> tuple[bytes, int | None]:
    """Render the outputs; returns (body, json_length) where json_length is the value for the
    Inference-Header-Content-Length header, or None for an all-JSON body."""
    if req.outputs is None:
        selected = [(s.name, s.datatype, req.binary_output, 0) for s in sig.output_list]
    else:
        default = req.binary_output
        selected = [(o.name, sig.outputs[o.name].datatype, default if o.binary is None else o.binary,
                     o.classification) for o in req.outputs]
    entries = []
    chunks = []
    for name, datatype, binary, classes in selected:
        arr = outputs[name]
        if classes:
            arr = classify(arr, classes, batched)
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
            entries.append({"name": name, "datatype": datatype, "shape": list(arr.shape),
                            "data": arr.ravel().tolist()})
    doc = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    head = _dumps(doc).encode()
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def classify(arr: np.ndarray, classes: int, batched: bool) -> np.ndarray:
    """Top-`classes` entries as "value:index" strings, per batch row when `batched`."""
    rows = arr.reshape(arr.shape[0], -1) if batched and arr.ndim > 0 else arr.reshape(1, -1)
    n = min(classes, rows.shape[1])
    top = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :n]
    out = np.array([[f"{float(row[j]):f}:{j}" for j in idx] for row, idx in zip(rows, top)], dtype=object)
    return out if batched else out.reshape(n)
