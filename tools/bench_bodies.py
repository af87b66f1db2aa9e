"""KServe v2 request bodies the benchmarks send, and the output they read back: a short exact
sample, its JSON body, its binary tensor extension body (with the header length to send)."""
from __future__ import annotations

import json

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"


def sample_for(shape: list[int], seed: int = 0) -> np.ndarray:
    """One sample [1, ...] rounded to 4 decimals, so its JSON text is short and exact in float32."""
    x = np.random.default_rng(seed).standard_normal([1, *shape])
    return np.round(x, 4).astype(np.float32)  # float32 nearest to the 4-decimal text json_body writes


def json_body(sample: np.ndarray, input_name: str) -> bytes:
    flat = [round(float(v), 4) for v in sample.ravel()]
    doc = {"inputs": [{"name": input_name, "shape": list(sample.shape), "datatype": "FP32", "data": flat}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def binary_body(sample: np.ndarray, input_name: str, output_name: str) -> tuple[bytes, int]:
    """Binary tensor extension body (input raw little-endian FP32, output asked as JSON) and
    the length of its JSON header."""
    raw = np.ascontiguousarray(sample, dtype="<f4").tobytes()
    head = {"inputs": [{"name": input_name, "shape": list(sample.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [{"name": output_name, "parameters": {"binary_data": False}}]}
    h = json.dumps(head, separators=(",", ":")).encode()
    return h + raw, len(h)


def decode_output(raw: bytes, output_name: str) -> np.ndarray:
    doc = json.loads(raw)
    out = next(o for o in doc["outputs"] if o["name"] == output_name)
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
