"""One batch at a time (low load) always ran on a model's first instance: the batcher offered its idle
instances in the list's order and the pool gave a batch naming none to the first of those with the most
free slots, so on a multi-device host device 0 ran hotter than the others.
Equal candidates are now taken in turn, after the one taken last. Real server on a real port (its
Chrome trace names the instance of each batch), on the CPU runtime; the pool alone: tests/runtime/test_pool.py."""
from __future__ import annotations

import json

from tests.serving import ServerThread, free_port, json_call, server_config

LONE_REQUESTS = 6


def _affine_body(index: int) -> bytes:
    return json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8},
        {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [index] * 3}]}).encode()


def test_lone_requests_one_after_another_take_both_instances_in_turn(models_dir, tmp_path):
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": "chrome"}
    config = server_config(models_dir, port=free_port(), trace=trace, trace_dir=str(tmp_path / "traces"),
                           model_control_mode="none", model_defaults={"instances": 2})
    with ServerThread(config) as srv:
        for index in range(LONE_REQUESTS):  # each answered before the next is sent
            status, answer = json_call(srv.url, "/v2/models/affine/infer", _affine_body(index))
            assert status == 200 and answer["outputs"][1]["data"] == [2 * index] * 3, answer
    events = json.loads((tmp_path / "trace.json").read_bytes())["traceEvents"]
    batches = sorted((e for e in events if e["ph"] == "X" and e["name"].startswith("batch #")), key=lambda e: e["ts"])
    ran_on = [batch["args"]["instance"] for batch in batches]
    assert len(ran_on) == LONE_REQUESTS and len(set(ran_on)) == 2, ran_on
    assert all(a != b for a, b in zip(ran_on, ran_on[1:])), ran_on  # in turn

