"""Trace files as Triton keeps them, on the real server with tritonclient (a trace-feature tester's
finds): one file per trace_file for the server's life, a later write appended to it (a second
write replaced what it held); written as soon as a trace_count is spent; a request timed out in
its queue traced with QUEUE_START; Triton's JSON without the parent_id 0 Triton never writes;
tracing with no trace_file refused as Triton refuses it; the operator's trace file as GET shows
it, written back, meaning that file."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, server_config

from .full_queue import affine_server

TRACING = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
OFF = {"trace_level": ["OFF"]}


@pytest.fixture(scope="module")
def srv(traced_server):
    return traced_server


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


def test_a_trace_file_written_again_keeps_what_it_held(srv, client):
    """Tracing paused and resumed to one trace_file: the second write replaced the first's 3
    traces with its 2 (Triton appends each batch of traces to the file for the server's life)."""
    path = srv.trace_dir / "rate.json"
    client.update_trace_settings(settings=dict(TRACING, trace_file="rate.json", trace_format="triton"))
    _infer(client, ["a0", "a1", "a2"])
    client.update_trace_settings(settings=OFF)
    _read_when(path, lambda e: len(_heads(e)) == 3, "held the first 3 traces")
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    _infer(client, ["b0", "b1"])
    client.update_trace_settings(settings=OFF)
    entries = _read_when(path, lambda e: len(_heads(e)) != 3, "changed")
    heads = _heads(entries)
    assert [h["request_id"] for h in heads] == ["a0", "a1", "a2", "b0", "b1"]
    assert len({h["id"] for h in heads}) == 5
    # a file holds one format: another one for it is refused, a new name taken
    with pytest.raises(InferenceServerException) as refused:
        client.update_trace_settings(settings=dict(TRACING, trace_format="chrome"))
    assert refused.value.status() == "400" and client.get_trace_settings()["trace_format"] == "triton"
    assert refused.value.message() == (
        "trace_format: chrome traces cannot go to 'rate.json': it holds triton traces already (a trace file holds "
        "one format, as this server appends to it); name another trace_file for the chrome traces")
    client.update_trace_settings(settings=dict(TRACING, trace_format="chrome", trace_file="rate-chrome.json"))


@pytest.mark.parametrize("first", ["affine", ""])
def test_a_format_refused_for_a_file_other_settings_take_names_both(srv, client, first):
    """Settings naming a file that other settings trace to in the other format, nothing written
    yet: the 400 said the file took the format asked for and blamed the other side ("'rate.json'
    takes chrome traces ...; name another trace_file for triton ones (model 'digits''s
    trace_format)"). It names the format refused and the one the file takes, and from whom."""
    shared = dict(TRACING, trace_file="formats.json")
    try:
        client.update_trace_settings(model_name=first, settings=dict(shared, trace_format="triton"))
        before = client.get_trace_settings(model_name="double")
        with pytest.raises(InferenceServerException) as refused:
            client.update_trace_settings(model_name="double", settings=dict(shared, trace_format="chrome"))
        holder = "model 'affine'" if first else "the global settings"
        assert refused.value.status() == "400" and refused.value.message() == (
            f"trace_format: chrome traces cannot go to 'formats.json': it takes triton traces from {holder} (a "
            "trace file holds one format, as this server appends to it); name another trace_file for the chrome traces")
        assert client.get_trace_settings(model_name="double") == before  # refused: nothing changed
    finally:
        client.update_trace_settings(model_name="affine", settings={})


def test_a_model_and_the_global_settings_sharing_a_name_write_one_file(srv, client):
    path = srv.trace_dir / "shared.json"
    client.update_trace_settings(model_name="double", settings=dict(TRACING, trace_file="shared.json"))
    _infer(client, ["m0", "m1"])
    client.update_trace_settings(model_name="double", settings=OFF)
    _read_when(path, lambda doc: len(_requests(doc)) == 2, "held the model's 2 traces")
    client.update_trace_settings(model_name="double", settings={})  # it follows the global settings
    client.update_trace_settings(settings=dict(TRACING, trace_file="shared.json"))
    _infer(client, ["g0"])
    client.update_trace_settings(settings=OFF)
    doc = _read_when(path, lambda doc: len(_requests(doc)) != 2, "changed")
    assert sorted(e["args"]["request_id"] for e in _requests(doc)) == ["g0", "m0", "m1"]
    assert doc["otherData"]["requests"] == 3
    named = [(e["pid"], e.get("tid")) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"].endswith("_name")]
    assert len(named) == len(set(named))  # each track named once, the part appended naming only its new ones


def test_the_file_is_written_once_the_trace_count_is_spent(srv, client):
    """Nothing was written until OFF or shutdown (a SIGKILL in between lost the traces); Triton
    writes them as soon as the count is spent."""
    client.update_trace_settings(model_name="double", settings=dict(TRACING, trace_count="2", trace_file="count.json",
                                                                   trace_format="triton"))
    _infer(client, ["c0", "c1", "c2"])
    entries = _read_when(srv.trace_dir / "count.json", lambda e: True, "written")
    assert [h["request_id"] for h in _heads(entries)] == ["c0", "c1"]


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


def test_tracing_with_no_trace_file_is_refused(srv, client):
    """Triton answers 400 "trace file name is not given"; the traces were kept in memory, up to
    50,000, for nothing on a server to read."""
    before = client.get_trace_settings()
    with pytest.raises(InferenceServerException, match="trace_file: trace file name is not given") as refused:
        client.update_trace_settings(settings=TRACING)
    assert refused.value.status() == "400"
    with pytest.raises(InferenceServerException, match="trace file name is not given"):
        client.update_trace_settings(model_name="double", settings=TRACING)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    with pytest.raises(InferenceServerException, match="trace file name is not given") as refused:
        grpc.update_trace_settings(settings=TRACING)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.get_trace_settings() == before and client.get_trace_settings(model_name="double") == before
    client.update_trace_settings(settings={"trace_file": "named.json"})  # with a file: taken
    client.update_trace_settings(model_name="double", settings=TRACING)
    with pytest.raises(InferenceServerException, match=r"trace file name is not given \(model 'double' would trace"):
        client.update_trace_settings(settings={"trace_file": None})  # the model would trace with none
    assert client.get_trace_settings()["trace_file"] == "named.json"


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


def test_the_operators_trace_file_paused_and_resumed_keeps_its_traces(models_dir, tmp_path):
    """--trace FILE, tracing turned OFF and on again through the API: the traces before the
    pause were replaced at shutdown by those after it."""
    boot = tmp_path / "run" / "boot.json"
    config = server_config(models_dir, trace={"level": "TIMESTAMPS", "rate": 1, "file": str(boot)},
                           trace_dir=str(tmp_path / "traces"))
    with ServerThread(config) as srv, http.InferenceServerClient(srv.url) as c:
        _infer(c, ["before0", "before1"])
        c.update_trace_settings(settings=OFF)
        _read_when(boot, lambda doc: len(_requests(doc)) == 2, "held the first 2 traces")
        c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        _infer(c, ["after"])
    doc = json.loads(boot.read_bytes())  # written at shutdown
    assert sorted(e["args"]["request_id"] for e in _requests(doc)) == ["after", "before0", "before1"]


def test_the_operators_trace_file_written_back_as_shown_stays_that_file(models_dir, tmp_path):
    """GET shows --trace /abs/run/boot.json as "boot.json" (no absolute path to a client):
    POSTing that value back moved the traces to the trace folder's boot.json."""
    boot = tmp_path / "run" / "boot.json"
    config = server_config(models_dir, trace={"file": str(boot)}, trace_dir=str(tmp_path / "traces"))
    with ServerThread(config) as srv, http.InferenceServerClient(srv.url) as c:
        shown = c.get_trace_settings()
        assert shown["trace_file"] == "boot.json"
        assert c.update_trace_settings(settings=dict(shown, **TRACING)) == dict(shown, **TRACING)
        _infer(c, ["back"])
        c.update_trace_settings(settings=OFF)
        doc = _read_when(boot, lambda doc: True, "written")
    assert [e["args"]["request_id"] for e in _requests(doc)] == ["back"]
    assert not (tmp_path / "traces" / "boot.json").exists()
