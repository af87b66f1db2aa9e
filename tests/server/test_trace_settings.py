"""Triton's trace extension on the real server: tritonclient's get/update_trace_settings over HTTP
and gRPC, per-model settings, clearing, and bad settings answered 400 naming the setting."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, server_config


@pytest.fixture(scope="module")
def srv(traced_server):
    return traced_server


@pytest.fixture
def http_client(srv):
    """tritonclient's HTTP client, closed on this thread (left to the garbage collector, its
    gevent pool may close on another thread and fail there)."""
    with http.InferenceServerClient(srv.url) as client:
        yield client


def _written(path):
    """The JSON of a trace file the server's writer thread is writing (it appears whole)."""
    for _ in range(200):
        if path.exists():
            break
        time.sleep(0.05)
    return json.loads(path.read_bytes())


def _infer(client, n=1):
    for i in range(n):
        x = http.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.full((1, 16), i, np.float32))
        client.infer("double", [x])


def test_defaults_global_and_model_settings_and_clearing(http_client):
    client = http_client
    assert "trace" in client.get_server_metadata()["extensions"]
    assert client.get_trace_settings() == {
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
        "trace_file": "", "trace_format": "chrome", "trace_mode": "triton"}
    got = client.update_trace_settings(model_name="double", settings={"trace_rate": "7", "trace_level": ["TIMESTAMPS"],
                                                                      "trace_file": "double.json"})
    assert got["trace_rate"] == "7" and got["trace_level"] == ["TIMESTAMPS"]
    assert client.get_trace_settings()["trace_rate"] == "1000"  # the global settings are untouched
    client.update_trace_settings(settings={"trace_rate": "50"})
    cleared = client.update_trace_settings(model_name="double", settings={"trace_rate": None})
    assert cleared["trace_rate"] == "50" and cleared["trace_level"] == ["TIMESTAMPS"]
    # an empty update drops the model's own settings: it follows the global ones again
    assert client.update_trace_settings(model_name="double", settings={}) == client.get_trace_settings()
    client.update_trace_settings(settings={"trace_rate": "1000"})


def test_a_model_follows_the_global_settings_it_did_not_set(http_client):
    """Triton's rule: a model's settings are the global ones but for those it set itself, also
    as the global ones change later; a null stops following its own value."""
    client = http_client
    client.update_trace_settings(model_name="double", settings={"trace_count": "5"})
    client.update_trace_settings(settings={"trace_rate": "77", "trace_level": ["TIMESTAMPS"], "trace_file": "all.json"})
    got = client.get_trace_settings(model_name="double")
    assert got["trace_rate"] == "77" and got["trace_level"] == ["TIMESTAMPS"] and got["trace_count"] == "5"
    client.update_trace_settings(model_name="double", settings={"trace_rate": "7"})
    client.update_trace_settings(model_name="double", settings={"trace_rate": None})
    client.update_trace_settings(settings={"trace_rate": "88"})
    assert client.get_trace_settings(model_name="double")["trace_rate"] == "88"  # followed again
    # tracing turned off globally turns it off for the model that set only its count
    client.update_trace_settings(settings={"trace_level": ["OFF"]})
    assert client.get_trace_settings(model_name="double")["trace_level"] == ["OFF"]
    # a null in a global update restores the value the server started with
    client.update_trace_settings(settings={"trace_rate": None, "trace_level": None, "trace_file": None})
    assert client.get_trace_settings()["trace_rate"] == "1000"
    assert client.get_trace_settings(model_name="double")["trace_rate"] == "1000"
    client.update_trace_settings(model_name="double", settings={})
    assert client.get_trace_settings(model_name="double")["trace_count"] == "-1"


def test_trace_count_counts_down_and_stops_tracing(srv, http_client):
    client = http_client
    client.update_trace_settings(model_name="double", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "3", "trace_file": "count.json"})
    _infer(client, 10)  # every second request: 5 candidates, 3 traced
    assert client.get_trace_settings(model_name="double")["trace_count"] == "0"
    client.update_trace_settings(model_name="double", settings={"trace_level": ["OFF"]})
    doc = _written(srv.trace_dir / "count.json")
    assert doc["otherData"]["requests"] == 3
    client.update_trace_settings(model_name="double", settings={})


@pytest.mark.parametrize("settings, message", [
    ({"trace_level": ["TENSORS"]}, "trace_level: TENSORS is not supported"),
    ({"trace_level": ["LOUD"]}, "trace_level: expected OFF or TIMESTAMPS, got 'LOUD'"),
    ({"trace_level": ["TIMESTAMPS", "OFF"]}, "trace_level: OFF must be the only level given"),  # (was TIMESTAMPS)
    ({"trace_rate": "0"}, "trace_rate: must be between 1"),
    ({"trace_rate": "often"}, "trace_rate: expected an integer"),
    ({"trace_count": "-2"}, "trace_count: must be between -1"),
    ({"trace_count": "2147483648"}, "trace_count: must be between -1 and 2147483647, got"),  # (said 2147483648)
    ({"trace_rate": "1_000"}, "trace_rate: expected an integer, got '1_000'"),  # (int() took it as 1000)
    ({"trace_format": "xml"}, "trace_format: expected chrome or triton"),
    # (it quoted the path, which the redaction of paths shortened to a relative 'passwd')
    ({"trace_file": "/etc/passwd"}, "trace_file: must be a relative name inside the trace folder, not an absolute path$"),
    ({"trace_file": "../escape.json"}, "trace_file: must be a relative name inside the trace folder, got '../escape.json'"),
    ({"trace_colour": "red"}, "unknown trace setting 'trace_colour'"),
    ({"trace_file": "c" * 256 + "/x.json"}, "trace_file: longer than 1024 bytes, or a folder or file name"),  # was 500
])
def test_bad_settings_are_400_naming_the_setting_and_change_nothing(http_client, settings, message):
    client = http_client
    before = client.get_trace_settings()
    with pytest.raises(InferenceServerException, match=message) as info:
        client.update_trace_settings(settings=settings)
    assert info.value.status() == "400"
    assert client.get_trace_settings() == before
    assert not os.path.exists("/etc/passwd.0")  # nothing written where the bad trace_file named (root may)


def test_unknown_model_and_malformed_bodies(srv):
    async def go():
        base = f"http://{srv.url}/v2"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/models/nope/trace/setting") as resp:
                assert resp.status == 404 and "nope" in (await resp.json())["error"]
            async with session.post(f"{base}/trace/setting", data=b"[1, 2]") as resp:
                assert resp.status == 400 and "JSON object" in (await resp.json())["error"]
            async with session.post(f"{base}/trace/setting", data=b"{") as resp:
                assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]
            async with session.post(f"{base}/trace/setting", data=b" " * 70000) as resp:
                assert resp.status == 413 and "exceeds" in (await resp.json())["error"]
    asyncio.run(go())


def test_grpc_trace_setting(srv, http_client):
    grpc_port = srv.config.grpc_port
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    got = client.update_trace_settings(model_name="double", settings={"trace_rate": "9"}, as_json=True)
    assert got["settings"]["trace_rate"]["value"] == ["9"]
    cleared = client.update_trace_settings(model_name="double", settings={"trace_rate": None}, as_json=True)
    assert cleared["settings"]["trace_rate"]["value"] == ["1000"]
    with pytest.raises(InferenceServerException, match="trace_rate: must be between 1"):
        client.update_trace_settings(settings={"trace_rate": "0"})
    http_client.update_trace_settings(model_name="double", settings={})


def test_grpc_statistics_leave_out_the_http_only_utilisation(srv, http_client):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    _infer(http_client)
    stats = client.get_inference_statistics("double", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 1 and "utilisation" not in stats


def test_a_grpc_request_is_traced_with_its_id(srv, http_client):
    http_client.update_trace_settings(model_name="double", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "grpc.json", "trace_format": "triton"})
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    x = grpcclient.InferInput("x", [2, 16], "FP32")
    x.set_data_from_numpy(np.ones((2, 16), np.float32))
    client.infer("double", [x], request_id="g-1")
    client.infer("double", [x], headers={"x-request-id": "meta-2"})  # no id field: the metadata names it
    http_client.update_trace_settings(model_name="double", settings={"trace_level": ["OFF"]})
    http_client.update_trace_settings(model_name="double", settings={})
    entries = _written(srv.trace_dir / "grpc.json")
    heads = [e for e in entries if "model_name" in e]
    assert [h["request_id"] for h in heads] == ["g-1", "meta-2"]
    names = [e["timestamps"][0]["name"] for e in entries if "timestamps" in e and e["id"] == heads[0]["id"]]
    assert names[0] == "GRPC_WAITREAD_START" and names[-1] == "GRPC_SEND_END" and "COMPUTE_END" in names


def test_trace_settings_of_the_file_that_trace_nothing_are_said(tmp_path, caplog):
    """A trace file with the level OFF, or TIMESTAMPS with no file, started silently and recorded
    nothing (the command line's flags were warned about, not the file's: an audit's finding)."""
    caplog.set_level(logging.WARNING, logger="aclserve.trace")
    (tmp_path / "models").mkdir()
    file = str(tmp_path / "trace.json")
    for trace, said in (({"file": file}, f"trace.file is {file} but trace.level is OFF: nothing is traced"),
                        ({"level": "TIMESTAMPS"}, "trace.level is TIMESTAMPS but no trace.file is set: traces are "
                                                  "kept in memory and never written; set trace.file"),
                        ({"level": "TIMESTAMPS", "file": file, "count": 0}, "trace.count is 0: no request is traced"),
                        ({"level": "TIMESTAMPS", "file": file}, None)):
        caplog.clear()
        with ServerThread(server_config(tmp_path / "models", trace=trace)):
            pass
        warned = [r.getMessage() for r in caplog.records if r.name == "aclserve.trace.tracer"]
        if said is None:
            assert warned == [], trace
        else:
            assert len(warned) == 1 and said in warned[0], (trace, warned)
