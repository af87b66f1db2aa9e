"""The affine model's inputs (X, IDX), their KServe v2 JSON document, and a body posted raw to a
model's infer route: for the HTTP protocol tests (tests/server/test_server_*.py)."""
import json

import numpy as np

from tests.serving import request

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


def doc(x=X, idx=IDX, **extra):
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()},
                       {"name": "idx", "datatype": "INT64", "shape": list(idx.shape), "data": idx.ravel().tolist()}],
            **extra}


def infer_json(server, body, headers=None, model="affine"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(server, "POST", f"/v2/models/{model}/infer", data=raw, headers=headers or {})
