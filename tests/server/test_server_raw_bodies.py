"""The real server driven by raw requests, as clients other than tritonclient send them: JSON
bodies and ids echoed, raw binary bodies (one row each), request bodies compressed, answers
framed in binary or compressed per Accept-Encoding."""
import gzip
import json
import zlib

import numpy as np
import pytest

from tests.serving import request

from .affine_requests import IDX, X, doc, infer_json


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


def test_large_nested_json_body_is_decoded_correctly(server):
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 16], "data": x.tolist()}]}
    raw = json.dumps(body, indent=1000).encode()  # whitespace: more bytes than max_json_elements
    assert len(raw) > 1 << 18
    status, _, out = infer_json(server, raw, model="double")
    assert status == 200
    y = json.loads(out)["outputs"][0]
    np.testing.assert_array_equal(np.array(y["data"], np.float32).reshape(y["shape"]), x * 2)


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
