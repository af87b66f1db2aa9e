"""The real server on a real port, driven by tritonclient.http: health, metadata and config,
inference (outputs in JSON or binary, compressed, classified), its errors, the repository index and
models unloaded through it (404, a version named or not), statistics."""
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serving import request

from .affine_requests import IDX, X


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


def test_statistics_fields_perf_analyzer_reads(client):
    client.infer("affine", inputs())
    stats = client.get_inference_statistics("affine")["model_stats"]
    entry = next(s for s in stats if s["version"] == "1")
    assert entry["name"] == "affine" and entry["inference_count"] >= 2 and entry["execution_count"] >= 1
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                "cache_hit", "cache_miss"):
        assert set(entry["inference_stats"][key]) == {"count", "ns"}
    assert entry["inference_stats"]["queue"]["count"] >= entry["inference_stats"]["success"]["count"] >= 1


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
