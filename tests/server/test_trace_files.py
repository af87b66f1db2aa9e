"""Trace files as Triton writes them, on the real server with tritonclient (a trace-feature
tester's finds): a request timed out in its queue traced with QUEUE_START; Triton's JSON without
the parent_id 0 Triton never writes."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, server_config

from .full_queue import affine_server

TRACING = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
OFF = {"trace_level": ["OFF"]}


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("traces")
    with ServerThread(server_config(models_dir, grpc_port=free_port(), trace_dir=str(trace_dir))) as server:
        server.trace_dir = trace_dir
        yield server


@pytest.fixture
def client(srv):
    with http.InferenceServerClient(srv.url) as c:
        yield c
    with http.InferenceServerClient(srv.url) as c:  # every test leaves the settings as it found them
        c.update_trace_settings(model_name="double", settings={})
        c.update_trace_settings(settings={key: None for key in ("trace_level", "trace_rate", "trace_count",
                                                                "trace_file", "trace_format")})


def _infer(client, ids):
    for request_id in ids:
        x = http.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        client.infer("double", [x], request_id=request_id)


def _read_when(path, done, what):
    """The JSON of a trace file once `done(doc)` (the writer thread writes it whole, after the
    answer that made it due): a hang guard, not a timing check."""
    doc = None
    for _ in range(300):
        if path.exists():
            doc = json.loads(path.read_bytes())
            if done(doc):
                return doc
        time.sleep(0.05)
    raise AssertionError(f"{path.name}: never {what}; it holds {doc}")


def _heads(entries):
    return [e for e in entries if "model_name" in e]


def _requests(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"].startswith("request ")]


def test_triton_json_has_no_parent_id_and_no_empty_request_id(srv, client):
    """Triton writes parent_id only for a child trace, request_id only when there is one:
    "parent_id": 0 on every request made trace_summary.py print a Data Flow section."""
    client.update_trace_settings(settings=dict(TRACING, trace_file="heads.json", trace_format="triton"))
    _infer(client, ["named", ""])
    client.update_trace_settings(settings=OFF)
    heads = _heads(_read_when(srv.trace_dir / "heads.json", lambda e: True, "written"))
    assert [sorted(h) for h in heads] == [["id", "model_name", "model_version", "request_id"],
                                          ["id", "model_name", "model_version"]]
    assert heads[0]["request_id"] == "named"


def test_a_request_timed_out_in_its_queue_has_its_queue_start(models_dir, tmp_path, make_config):
    """Only a batch formed set QUEUE_START: a request that timed out in its queue had none."""
    (tmp_path / "models").mkdir()
    with affine_server(models_dir, tmp_path / "models", make_config, queue_size=2,
                       trace_dir=str(tmp_path / "traces")) as srv:
        with http.InferenceServerClient(srv.url) as c:
            c.update_trace_settings(settings=dict(TRACING, trace_file="timeout.json", trace_format="triton"))
            x = http.InferInput("x", [3, 8], "FP32")  # (3 rows wait for more: full_queue.py's WAITING)
            x.set_data_from_numpy(np.ones((3, 8), np.float32))
            idx = http.InferInput("idx", [3, 3], "INT64")
            idx.set_data_from_numpy(np.ones((3, 3), np.int64))
            with pytest.raises(InferenceServerException, match="timed out"):  # (its batch's window: a minute)
                c.infer("affine", [x, idx], request_id="late", timeout=1000)
            c.update_trace_settings(settings=OFF)
            entries = _read_when(tmp_path / "traces" / "timeout.json", lambda e: True, "written")
    names = [e["timestamps"][0]["name"] for e in entries if "timestamps" in e]
    assert "QUEUE_START" in names and "COMPUTE_START" not in names and names[-1] == "HTTP_SEND_END"
