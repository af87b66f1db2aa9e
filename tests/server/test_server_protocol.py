"""The real server on a real port, driven by tritonclient.http and raw aiohttp requests."""
import asyncio
import gzip
import json
import socket
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serving import request


X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def inputs(binary=True, x=X, idx=IDX):
    a = httpclient.InferInput("x", list(x.shape), "FP32")
    a.set_data_from_numpy(x, binary_data=binary)
    b = httpclient.InferInput("idx", list(idx.shape), "INT64")
    b.set_data_from_numpy(idx, binary_data=binary)
    return [a, b]


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "aclserve" and isinstance(meta["extensions"], list)
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_and_config(client):
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "1")
    meta = client.get_model_metadata("affine")
    assert meta["platform"] == "ascend_om" and meta["versions"] == ["1"]
    assert {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]} == {
        "x": ("FP32", [-1, 8]), "idx": ("INT64", [-1, 3])}
    config = client.get_model_config("affine")
    assert config["max_batch_size"] == 8
    assert {i["name"]: (i["data_type"], i["dims"]) for i in config["input"]} == {
        "x": ("TYPE_FP32", [8]), "idx": ("TYPE_INT64", [3])}
    assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


@pytest.mark.parametrize("binary", [True, False])
def test_infer_matches_reference(client, binary, reference):
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary),
               httpclient.InferRequestedOutput("s", binary_data=binary)]
    result = client.infer("affine", inputs(binary), outputs=outputs, request_id="req-7")
    want = reference(X, IDX)
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("s"), want["s"])
    assert result.get_response()["id"] == "req-7"


def test_infer_default_outputs_versioned_compressed(client):
    result = client.infer("affine", inputs(), model_version="1", priority=1, timeout=10_000_000,
                          request_compression_algorithm="gzip", response_compression_algorithm="deflate")
    np.testing.assert_array_equal(result.as_numpy("s"), IDX * 2)


def test_infer_error_is_reported(client):
    bad = httpclient.InferInput("x", [1, 7], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 7), np.float32))
    with pytest.raises(InferenceServerException, match="shape") as info:
        client.infer("affine", [bad, inputs()[1]])
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException) as info:
        client.infer("nosuchmodel", inputs())
    assert info.value.status() == "404"


def test_repository_index_unload_load(client):
    names = {m["name"]: m for m in client.get_model_repository_index()}
    assert names["affine"]["state"] == "READY" and names["double"]["state"] == "READY"
    client.unload_model("double")
    assert not client.is_model_ready("double")
    client.load_model("double")
    assert client.is_model_ready("double")


def test_a_load_whose_config_parameter_is_null_loads_as_one_without_it(server):
    """null is none elsewhere: `{"config": null}` was refused as a config override."""
    status, _, raw = request(server, "POST", "/v2/repository/models/double/load", json={"parameters": {"config": None}})
    assert status == 200, raw
    status, _, raw = request(server, "POST", "/v2/repository/models/double/load", json={"parameters": {"config": "{}"}})
    assert status == 400 and "config override" in json.loads(raw)["error"], raw


def test_a_model_unloaded_on_purpose_is_not_found_whether_a_version_is_named_or_not(client, server):
    """As Triton with no version named: 404 "has no available versions" (it was a 503 with
    Retry-After, inviting retries that never succeed). A version named was still that 503 (Triton:
    UNAVAILABLE "is not at ready state"), though only a load call serves it again: a tester's
    client retried it for good. Now a 404 saying so; its /ready too (4xx: not ready, as the
    protocol says)."""
    client.unload_model("double")
    pinned = ("model double version 1 is not available (unloaded through the repository API: a load call "
              "serves it)")
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]})
    try:
        for path in ("/v2/models/double", "/v2/models/double/ready", "/v2/models/double/config"):
            status, headers, raw = request(server, "GET", path)
            assert status == 404 and "Retry-After" not in headers, (path, raw)
            assert json.loads(raw) == {"error": "model double has no available versions (unloaded)"}
        for method, path in (("POST", "/v2/models/double/versions/1/infer"), ("GET", "/v2/models/double/versions/1"),
                             ("GET", "/v2/models/double/versions/1/ready")):
            status, headers, raw = request(server, method, path, data=body.encode() if method == "POST" else None)
            assert status == 404 and "Retry-After" not in headers, (path, raw)
            assert json.loads(raw) == {"error": pinned}, path
        assert not client.is_model_ready("double", "1")
    finally:
        client.load_model("double")
    assert client.is_model_ready("double") and client.is_model_ready("double", "1")


def test_a_version_that_is_not_a_number_is_a_bad_request(server):
    """As Triton (GetModelVersionFromString): 400, not the 404 of a version it does not have."""
    for path in ("/v2/models/affine/versions/abc", "/v2/models/affine/versions/abc/ready"):
        status, _, raw = request(server, "GET", path)
        assert status == 400 and json.loads(raw) == {"error": "version must be a positive integer, got 'abc'"}, raw
    for zero in ("0", "00"):  # (no version folder is 0: it was a 404 beside -1's 400)
        status, _, raw = request(server, "GET", f"/v2/models/affine/versions/{zero}")
        assert status == 400 and json.loads(raw) == {"error": f"version must be a positive integer, got '{zero}'"}
    status, _, raw = request(server, "GET", "/v2/models/affine/versions/7")
    assert status == 404 and "no version 7" in json.loads(raw)["error"]


def test_the_kserve_v1_protocol_is_refused_saying_to_use_v2(server):
    """The KServe SDK's InferenceRESTClient speaks v1 unless told (its is_server_live is GET /):
    a bare "no route" left a KServe user guessing (a KServe user's check)."""
    for method, path in (("POST", "/v1/models/affine:predict"), ("GET", "/v1/models/affine"), ("GET", "/"),
                         ("GET", "/v1")):
        status, _, raw = request(server, method, path)
        said = json.loads(raw)["error"]
        assert status == 404 and said == (f"no route for {method} {path} (the KServe v1 protocol is not served: "
                                          "use /v2/models/{model}/infer, with the KServe SDK "
                                          "RESTConfig(protocol='v2'))"), said
    status, _, raw = request(server, "GET", "/v2/nothing")
    assert status == 404 and json.loads(raw)["error"] == "no route for GET /v2/nothing"


def test_a_connect_request_is_told_no_route_naming_its_target(server):
    """CONNECT's target is an authority (`h:443`), whose path is empty: the 404 said "no route for
    CONNECT " (a tester, t90)."""
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # (the timeout: a hang guard)
        sock.sendall(b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")
        got = b""
        while b'"}' not in got:
            got += sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 404 ") and got.endswith(b'{"error":"no route for CONNECT h:443"}'), got


def test_the_generate_extension_is_refused_naming_itself_as_the_other_extensions_not_offered(server):
    """Triton's generate and generate_stream answered a bare 404 "no route", where shared memory
    and logging answer a 400 naming their extension and what to do instead (a tester): generate
    is refused in the same words, on a model's and a version's routes, whatever the model."""
    status, _, raw = request(server, "POST", "/v2/logging", json={})
    assert status == 400 and json.loads(raw)["error"].startswith("/v2/logging: the logging extension is not supported")
    for path in ("/v2/models/affine/generate", "/v2/models/affine/generate_stream",
                 "/v2/models/affine/versions/1/generate", "/v2/models/nope/generate_stream"):
        status, _, raw = request(server, "POST", path, json={"text_input": "hello", "parameters": {"stream": False}})
        assert status == 400 and json.loads(raw) == {"error": f"{path}: the generate extension is not supported by "
                                                              "aclserve (send the inputs as tensors to the model's "
                                                              "infer route)"}, raw


def test_statistics_fields_perf_analyzer_reads(client):
    client.infer("affine", inputs())
    stats = client.get_inference_statistics("affine")["model_stats"]
    entry = next(s for s in stats if s["version"] == "1")
    assert entry["name"] == "affine" and entry["inference_count"] >= 2 and entry["execution_count"] >= 1
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                "cache_hit", "cache_miss"):
        assert set(entry["inference_stats"][key]) == {"count", "ns"}
    assert entry["inference_stats"]["queue"]["count"] >= entry["inference_stats"]["success"]["count"] >= 1


# -- raw protocol --------------------------------------------------------------------------------

def doc(x=X, idx=IDX, **extra):
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()},
                       {"name": "idx", "datatype": "INT64", "shape": list(idx.shape), "data": idx.ravel().tolist()}],
            **extra}


def infer_json(server, body, headers=None, model="affine"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(server, "POST", f"/v2/models/{model}/infer", data=raw, headers=headers or {})


def test_raw_json_infer_and_id_echo(server, reference):
    status, headers, body = infer_json(server, doc(id="abc"))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    out = json.loads(body)
    assert out["id"] == "abc" and out["model_name"] == "affine" and out["model_version"] == "1"
    y = next(o for o in out["outputs"] if o["name"] == "y")
    np.testing.assert_allclose(np.array(y["data"]).reshape(y["shape"]), reference(X, IDX)["y"], atol=1e-5)


def test_an_empty_id_is_not_echoed(server):
    """Triton echoes a request id only when it is not empty (http_server.cc); aclserve answered
    "id": "" (an HTTP conformance tester's find)."""
    status, _, body = infer_json(server, doc(id=""))
    assert status == 200 and "id" not in json.loads(body), body


def test_raw_binary_single_input(server):
    x = np.arange(16, dtype=np.float32)
    status, headers, body = request(server, "POST", "/v2/models/double/infer", data=x.tobytes(),
                                    headers={"Inference-Header-Content-Length": "0"})
    assert status == 200
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:n])
    assert head["outputs"][0]["shape"] == [1, 16]
    np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32), x * 2)


def test_a_raw_binary_body_of_two_rows_is_told_a_raw_body_is_one_row_and_how_to_send_several(server):
    """Two rows' bytes were refused as fitting no row ("does not fit input 'x' of shape [-1, 16]"):
    the answer says a raw body is one row, its size, and the header that sends more."""
    x = np.arange(32, dtype=np.float32)
    status, _, body = request(server, "POST", "/v2/models/double/infer", data=x.tobytes(),
                              headers={"Inference-Header-Content-Length": "0"})
    assert status == 400 and json.loads(body)["error"] == (
        "raw binary body of 128 bytes does not fit input 'x' of shape [-1, 16] (FP32): a raw body is one row, 64 "
        "bytes for this input; send several rows with the binary data extension, a JSON header giving the input's "
        "shape (e.g. [2, 16]) and binary_data_size, its length in Inference-Header-Content-Length"), body
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                                     "parameters": {"binary_data_size": 128}}]}).encode()
    status, _, body = request(server, "POST", "/v2/models/double/infer", data=header + x.tobytes(),
                              headers={"Inference-Header-Content-Length": str(len(header))})
    assert status == 200 and json.loads(body)["outputs"][0]["shape"] == [2, 16], body


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_request_body(server, encoding, compress, reference):
    status, _, body = infer_json(server, compress(json.dumps(doc()).encode()), {"Content-Encoding": encoding})
    assert status == 200, body
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
    want = reference(X, IDX)
    np.testing.assert_allclose(outputs["y"], want["y"], atol=1e-5)
    np.testing.assert_array_equal(outputs["s"], want["s"])


def test_binary_output_response_is_framed(server):
    status, headers, body = infer_json(server, doc(parameters={"binary_data_output": True}))
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    n = int(headers["Inference-Header-Content-Length"])
    sizes = [o["parameters"]["binary_data_size"] for o in json.loads(body[:n])["outputs"]]
    assert n + sum(sizes) == len(body)


BAD = [
    (b"{not json", None, 400, "not valid JSON"),
    ({"inputs": [dict(doc()["inputs"][0], datatype="FP64"), doc()["inputs"][1]]}, None, 400, "datatype"),
    (doc(x=np.zeros((2, 5), np.float32)), None, 400, "shape"),
    ({"inputs": doc()["inputs"][:1]}, None, 400, "missing input"),
    (doc(parameters={"priority": -3}), None, 400, "priority"),
    (doc(parameters={"priority": "high"}), None, 400, "priority"),
    (doc(outputs=[{"name": "zz"}]), None, 400, "unknown output"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "parameters": {"binary_data_size": 32}},
                 doc()["inputs"][1]]}, "binary", 400, "binary_data_size 32 does not match"),
    (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, 400, "nested too deeply"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [NaN, 0, 0, 0, 0, 0, 0, 0]}]}',
     None, 400, "NaN is not valid JSON"),
    (b"\xff\xfe{}", None, 400, "not valid JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0, 0, 1e400, 0, 0, 0, 0, 0]}]}',
     None, 400, "input 'x': data values out of range for FP32"),
    (doc(parameters={"pad": "a" * (800 << 10)}), None, 413, "max_json_bytes"),
    (json.dumps(doc(parameters={"junk": [0] * 300_000}), separators=(",", ":")).encode(), None, 413,
     "max_json_elements"),
]


@pytest.mark.parametrize("body,mode,status,match", BAD)
def test_bad_requests_get_400_with_message(server, body, mode, status, match):
    headers = {}
    if mode == "binary":
        head = json.dumps(body).encode()
        headers = {"Inference-Header-Content-Length": str(len(head))}
        body = head + b"\0" * 32
    got, resp_headers, raw = infer_json(server, body, headers)
    assert got == status and resp_headers["Content-Type"].startswith("application/json")
    assert match in json.loads(raw)["error"]


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value,shown", [("18446744073709551616", "18446744073709551616"),
                                         ("-9223372036854775809", "-9223372036854775809"),
                                         ("1" + "0" * 60, "an integer of 61 digits"), ("1e30", "1e+30"),
                                         # (a string of digits is taken up to 2**64 - 1: past it, the bound said)
                                         ('"18446744073709551616"', '"18446744073709551616"')],
                         ids=["2**64", "below-int64", "61-digits", "1e30", "string-2**64"])
@pytest.mark.parametrize("padding", [0, 2048], ids=["small", "simdjson"])  # (a JSON part of 2 KB or more)
def test_an_integer_parameter_out_of_range_is_quoted_as_sent(server, key, value, shown, padding):
    """The JSON decoders read an integer beyond 64 bits as a float: `"priority": 2**64` was
    refused "got 1.8446744073709552e+19" (a tester). Its digits now, cut as long values are."""
    body = json.dumps(doc(id="r" * padding, parameters={key: 0})).replace(f'"{key}": 0', f'"{key}": {value}').encode()
    status, _, raw = infer_json(server, body)
    expected = f"parameters.{key} must be an unsigned 64-bit integer (at most {2**64 - 1}), got {shown}"
    assert status == 400 and json.loads(raw)["error"] == expected


def test_digits_of_another_objects_parameter_are_not_quoted_for_the_requests(server):
    """An output's `priority` of another number the same float could be: the request's is not
    told it as its own (a reviewer); the float it was read as is shown instead."""
    body = json.dumps(doc(parameters={"priority": 0}, outputs=[{"name": "y", "parameters": {"priority": 0}}]))
    body = body.replace('"priority": 0}}', '"priority": 18446744073709551999}}', 1)
    body = body.replace('"priority": 0', '"priority": 18446744073709551616', 1).encode()
    status, _, raw = infer_json(server, body)
    assert status == 400 and json.loads(raw)["error"].endswith("got 1.8446744073709552e+19"), raw


def test_a_body_that_does_not_decompress_is_a_400(server):
    status, _, raw = infer_json(server, b"this is not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "content-encoding" in json.loads(raw)["error"].lower()
    assert infer_json(server, doc())[0] == 200  # still serving


def test_binary_chunk_size_mismatch(server):
    head = json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 8], "parameters": {"binary_data_size": 32}},
        {"name": "idx", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]}).encode()
    for extra in (b"\0" * 50, b"\0" * 60):
        status, _, raw = infer_json(server, head + extra, {"Inference-Header-Content-Length": str(len(head))})
        assert status == 400 and "bytes" in json.loads(raw)["error"]


def test_unknown_model_route_and_method(server):
    status, _, raw = infer_json(server, doc(), model="ghost")
    assert status == 404 and "ghost" in json.loads(raw)["error"]
    status, _, raw = request(server, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in json.loads(raw)
    status, _, raw = request(server, "DELETE", "/v2/health/live")
    assert status == 405 and "error" in json.loads(raw)
    status, _, raw = request(server, "GET", "/v2/models/ghost/config")
    assert status == 404


def test_oversize_body_413(server):
    status, _, raw = infer_json(server, b"[" + b"0," * (600 * 1024) + b"0]")  # all JSON: max_json_bytes is lower
    error = json.loads(raw)["error"]
    assert status == 413 and "786432 bytes (max_json_bytes; send large tensors with the binary" in error
    status, _, raw = infer_json(server, b"{}" + b"\0" * (1100 << 10), {"Inference-Header-Content-Length": "2"})
    assert status == 413 and "max_body_bytes" in json.loads(raw)["error"]
    assert infer_json(server, doc())[0] == 200  # still serving


def test_a_json_body_over_max_json_bytes_is_refused_before_it_is_sent(server):
    """900 KB declared (max_json_bytes 768 KiB, max_body_bytes 1 MiB), nothing of it sent: a body
    that is all JSON (no Inference-Header-Content-Length) is refused from its Content-Length at
    once, not read and charged to the memory budget to be refused then (waiting for it, the
    server's body timeout answered 408)."""
    async def exchange():
        reader, writer = await asyncio.open_connection(*server.url.split(":"))
        writer.write(f"POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {900 << 10}\r\n\r\n"
                     .encode())
        try:
            return await asyncio.wait_for(reader.readline(), 120)  # a hang guard
        finally:
            writer.close()
    assert b" 413 " in asyncio.run(exchange())


def test_a_control_body_over_its_route_limit_names_that_limit(server):
    """The trace and repository routes take at most 64 KiB and 1 MiB (or max_body_bytes when
    lower): a 413 names the limit that applies, not max_body_bytes, which raising would not
    help (a 100 KB trace setting was told the limit was max_body_bytes)."""
    from aclserve.server.body import body_limit
    status, _, raw = request(server, "POST", "/v2/trace/setting", data=b" " * (100 << 10))
    error = json.loads(raw)["error"]
    assert status == 413 and "65536 bytes (the trace setting API's limit)" in error and "max_body_bytes" not in error
    assert body_limit(64 << 20, 1 << 20, "the repository API's limit") == (1 << 20, "the repository API's limit")
    assert body_limit(1 << 19, 1 << 20, "the repository API's limit") == (1 << 19, "max_body_bytes")
    assert request(server, "GET", "/v2/trace/setting")[0] == 200  # still serving


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/repository/index"])
def test_a_header_byte_that_is_not_utf8_is_quoted_in_a_json_error_not_a_500(server, path):
    """aiohttp decodes header values as UTF-8 with surrogateescape, so `Expect: \\xff` reached the
    417's message as a lone surrogate, which orjson cannot write: a plain-text 500 and an ERROR
    with a traceback instead of the JSON 417."""
    from .hostile import open_raw, read_response

    async def scenario():
        reader, writer = await open_raw(server.url)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n".encode()
                     + b"Expect: \xff100-continue\r\n\r\n{}")
        status, answer = await read_response(reader)
        writer.close()
        return status, answer
    status, answer = asyncio.run(scenario())
    assert status == 417, answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "unknown expectation: Expect: \\udcff100-continue"}


def test_health_bodies(server):
    status, _, raw = request(server, "GET", "/v2/health/live")
    assert status == 200 and json.loads(raw) == {"live": True}
    status, _, raw = request(server, "GET", "/v2/health/ready")
    assert status == 200 and json.loads(raw) == {"ready": True}
    status, _, raw = request(server, "POST", "/v2/repository/index", data=b"")
    assert status == 200 and isinstance(json.loads(raw), list)
    status, _, raw = request(server, "POST", "/v2/repository/index", data=b"[" * 100_000)
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]


def test_large_nested_json_body_is_decoded_correctly(server):
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 16], "data": x.tolist()}]}
    raw = json.dumps(body, indent=1000).encode()  # whitespace: more bytes than max_json_elements
    assert len(raw) > 1 << 18
    status, _, out = infer_json(server, raw, model="double")
    assert status == 200
    y = json.loads(out)["outputs"][0]
    np.testing.assert_array_equal(np.array(y["data"], np.float32).reshape(y["shape"]), x * 2)


def test_non_finite_outputs_are_sent_as_null_with_a_count(client):
    x = np.ones((1, 16), np.float32)
    x[0, :3] = [3e38, -3e38, np.nan]  # y = 2 * x: +inf, -inf, nan
    a = httpclient.InferInput("x", [1, 16], "FP32")
    a.set_data_from_numpy(x, binary_data=True)
    json_y = httpclient.InferRequestedOutput("y", binary_data=False)
    result = client.infer("double", [a], outputs=[json_y])
    out = result.get_output("y")
    assert out["data"][:4] == [None, None, None, 2.0] and out["parameters"] == {"non_finite_values": 3}
    y = result.as_numpy("y")  # tritonclient reads null as NaN
    assert np.isnan(y[0, :3]).all() and (y[0, 3:] == 2).all()
    binary_y = client.infer("double", [a], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    np.testing.assert_array_equal(binary_y.as_numpy("y")[0, :3], [np.inf, -np.inf, np.nan])


def test_unexpected_exception_is_a_generic_500(caplog):
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from aclserve.errors import QueueFull
    from aclserve.server.error_responses import error_middleware

    async def boom(request):
        raise RuntimeError("secret detail")

    async def full(request):
        raise QueueFull("queue is full")

    async def go():
        app = web.Application(middlewares=[error_middleware])
        app.router.add_get("/boom", boom)
        app.router.add_get("/full", full)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/boom")
            assert resp.status == 500 and await resp.json() == {"error": "internal error"}
            resp = await client.get("/full")
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert await resp.json() == {"error": "queue is full"}
    asyncio.run(go())
    assert "secret detail" in caplog.text


def test_classification_and_statistics_variants(client, reference):
    out = httpclient.InferRequestedOutput("y", binary_data=True, class_count=2)
    result = client.infer("affine", inputs(), outputs=[out])
    classes = result.as_numpy("y")
    assert classes.shape == (2, 2)
    top = [int(c.decode().split(":")[1]) for c in classes[:, 0]]
    assert top == np.argmax(reference(X, IDX)["y"], axis=1).tolist()
    everything = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} >= {"affine", "double"}
    one = client.get_inference_statistics("affine", "1")["model_stats"]
    assert [s["version"] for s in one] == ["1"]


def test_response_compressed_per_accept_encoding(server):
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 3
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 16], "data": x.ravel().tolist()}]}
    status, headers, out = infer_json(server, body, {"Accept-Encoding": "gzip"}, model="double")
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert headers.get("Vary") == "Accept-Encoding"  # (for a cache between, as /metrics says it)
    assert json.loads(out)["outputs"][0]["shape"] == [8, 16]  # aiohttp inflated it
    # weights honoured as Triton does (aiohttp alone took the first of deflate / gzip named, even
    # at q=0): the first of the highest weight; `*` for a coding not named
    for accepted, coding in (("gzip;q=0", None), ("identity;q=1, gzip;q=0.001", None),
                             ("deflate;q=0.1, gzip;q=1", "gzip"), ("gzip, deflate", "gzip"),
                             ("deflate, gzip", "deflate"), ("identity;q=0.5, gzip;q=0.5", None),
                             ("gzip;q=0.2, *", "deflate"), ("br", None)):
        status, headers, out = infer_json(server, body, {"Accept-Encoding": accepted}, model="double")
        assert status == 200 and headers.get("Content-Encoding") == coding, accepted
        assert json.loads(out)["outputs"][0]["shape"] == [8, 16]
        # an answer sent as it is says Vary too: a cache between that kept it without would
        # not know that the same request accepting gzip is answered otherwise (RFC 9110 12.5.5)
        assert headers.get("Vary") == "Accept-Encoding", accepted
    status, headers, _ = infer_json(server, doc())  # too small to compress: Vary all the same (one rule)
    assert status == 200 and headers.get("Content-Encoding") is None and headers.get("Vary") == "Accept-Encoding"


def test_infer_paths_route_as_the_templates_say(server):
    ok = request(server, "POST", "/v2/models/affine/versions/1/infer", data=json.dumps(doc()).encode())
    assert ok[0] == 200 and json.loads(ok[2])["model_version"] == "1"
    status, _, raw = request(server, "POST", "/v2/models/affine/versions/9/infer", data=json.dumps(doc()).encode())
    assert status == 404 and "9" in json.loads(raw)["error"]
    # Not an infer path: it names version "infer" of the model's metadata route, which is GET only.
    status, _, raw = request(server, "POST", "/v2/models/affine/versions/infer", data=json.dumps(doc()).encode())
    assert status == 405 and "error" in json.loads(raw)
    status, headers, raw = request(server, "GET", "/v2/models/affine/infer")
    assert status == 405 and "error" in json.loads(raw)
    assert headers.get("Allow") == "POST"  # RFC 9110: a 405 names the methods the path takes
    # An Expect header: the route's expect handler answers 100 Continue, then the same answer.
    status, _, raw = request(server, "POST", "/v2/models/affine/infer", data=json.dumps(doc()).encode(),
                             headers={"Expect": "100-continue"})
    assert status == 200 and json.loads(raw)["model_name"] == "affine"
    status, _, raw = request(server, "POST", "/v2/models/ghost/infer", data=json.dumps(doc()).encode(),
                             headers={"Expect": "100-continue"})
    assert status == 404 and "ghost" in json.loads(raw)["error"]


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/repository/index"])
def test_a_client_gone_before_its_100_continue_leaves_no_traceback(server, path, caplog):
    """Head, `Expect: 100-continue` and body sent at once, then the connection closed: writing
    "100 Continue" to the closed transport raised out of the expect handler, and aiohttp logged an
    ERROR with a 20-line traceback for each such client (found by an attacker's re-test)."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    host, port = server.url.rsplit(":", 1)
    for _ in range(20):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head + body)
    status, _, _ = request(server, "GET", "/v2/health/live")  # after the 20 were handled
    assert status == 200
    assert "Error handling request" not in caplog.text and "Traceback" not in caplog.text
