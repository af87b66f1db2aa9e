"""tools/open_loop.py, the open-loop load of bench_overload.py: against the real server, it
counts each answer by status and the 200s' latency, whatever the server says."""
from __future__ import annotations

import asyncio
import json
import os
import sys

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import open_loop  # noqa: E402

ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                 {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}).encode()


def run(url: str, path: str, rate: float) -> dict:
    return asyncio.run(open_loop.run(f"http://{url}{path}", ONE_ROW, rate, seconds=1.0, warmup=0.2,
                                     headers=["Content-Type: application/json"], max_conns=50, timeout=5.0))


def test_answers_are_counted_by_status(server):
    served = run(server.url, "/v2/models/affine/infer", 100)
    assert served["per_s"].get("200", 0) > 0 and set(served["per_s"]) == {"200"}
    assert served["ok_per_s"] == served["per_s"]["200"]
    assert 0 < served["p50_ms"] <= served["p99_ms"]
    missing = run(server.url, "/v2/models/nope/infer", 100)
    assert missing["per_s"].get("404", 0) > 0 and missing["ok_per_s"] == 0
