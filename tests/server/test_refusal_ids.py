"""HTTP infer requests refused before any model version is found (404 unknown model or version, 503
its load to be retried) are named in the request log by the `id` their body states, as every other line is, when
their JSON is at most 4 KB (shedding.ID_READ_BYTES, the queue-full refusals' rule), else by their
X-Request-Id header. They were logged `"request_id": null` when the id was in the body alone
(tritonclient's HTTP client sends it there), while the same refusals over gRPC carried it (an
independent tester's find). Both HTTP paths: the guard's direct answers and aiohttp's."""
from __future__ import annotations

import json
import logging
import socket

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, server_config

ROW = {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}


@pytest.fixture(scope="module", params=[True, False], ids=["direct", "aiohttp"])
def logged(models_dir, request):
    with ServerThread(server_config(models_dir, request_log=True, direct_infer=request.param)) as srv:
        yield srv


def _post(url: str, path: str, body: bytes, headers: dict | None = None) -> int:
    """Its head and body in one write, so that the guard may answer it directly (direct.py)."""
    host, port = url.rsplit(":", 1)
    lines = [f"POST {path} HTTP/1.1", "Host: t", "Content-Type: application/json", f"Content-Length: {len(body)}",
             "Connection: close"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return int(sock.recv(65536).split(b" ", 2)[1])


def _lines(caplog) -> list[tuple]:
    return [(r.fields["request_id"], r.fields["model"], r.fields["status"])
            for r in caplog.records if r.name == "aclserve.requests"]


def test_a_request_for_no_serving_version_is_named_by_its_body_s_id(logged, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    small = json.dumps({"id": "b-1", "inputs": [ROW]}).encode()
    assert _post(logged.url, "/v2/models/nosuch/infer", small) == 404
    named_twice = json.dumps({"id": "b-2", "inputs": [ROW]}).encode()
    assert _post(logged.url, "/v2/models/double/versions/7/infer", named_twice, {"X-Request-Id": "h-2"}) == 404
    large = json.dumps({"id": "b-3", "inputs": [ROW], "parameters": {"note": "n" * 5000}}).encode()
    assert _post(logged.url, "/v2/models/nosuch/infer", large, {"X-Request-Id": "h-3"}) == 404
    client = httpclient.InferenceServerClient(logged.url)  # the id in its JSON part, tensors in binary after it
    x = httpclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nosuch", [x], request_id="tc-4")
    client.close()
    assert _lines(caplog) == [("b-1", "nosuch", 404), ("b-2", "double", 404),
                              ("h-3", "nosuch", 404),  # over 4 KB: not parsed for its id, the header names it
                              ("tc-4", "nosuch", 404)]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "aiohttp"])
def test_a_request_for_a_model_whose_load_is_retried_is_named_by_its_body_s_id(double_dir, caplog, clean_faults,
                                                                             direct):
    """503: its load failed with a transient device error, a retry due."""
    faults.inject("load", code=207001, count=1000)
    config = server_config(double_dir, request_log=True, direct_infer=direct, model_control_mode="none")
    with ServerThread(config) as srv:
        caplog.set_level(logging.INFO, logger="aclserve.requests")
        assert _post(srv.url, "/v2/models/double/infer", json.dumps({"id": "b-4", "inputs": [ROW]}).encode()) == 503
        faults.clear()
    assert _lines(caplog) == [("b-4", "double", 503)]
