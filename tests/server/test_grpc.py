"""The gRPC endpoint on a real port (the grpc_server fixture: conftest.py), driven by
tritonclient.grpc (sync and aio) and by the raw generated stub for what tritonclient cannot send
(typed `contents`): health, metadata, statistics, the repository calls, inference, priorities and
timeouts. ModelStreamInfer: test_grpc_streams.py."""
import asyncio
import logging
import queue
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests import REPO

from .grpc_inputs import IDX, X, affine_inputs


def test_health_metadata_and_config_match_http(client, grpc_server):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("affine")
    http = httpclient.InferenceServerClient(grpc_server.url)
    try:
        meta = client.get_server_metadata(as_json=True)
        assert meta["name"] == "aclserve" and meta == http.get_server_metadata()
        model = client.get_model_metadata("affine", as_json=True)
        assert model["platform"] == "ascend_om" and model["versions"] == ["1"]
        assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
            ("x", "FP32", ["-1", "8"]), ("idx", "INT64", ["-1", "3"])]  # int64 fields print as strings
        http_model = http.get_model_metadata("affine")
        assert [[int(d) for d in t["shape"]] for t in model["inputs"]] == [t["shape"] for t in http_model["inputs"]]
        config = client.get_model_config("affine").config
        assert config.max_batch_size == 8 and list(config.input[0].dims) == [8]
        assert list(config.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8]
        assert config.dynamic_batching.priority_levels == 3
    finally:
        http.close()


def test_statistics_of_a_version_without_a_model_is_refused(client, stub):
    """It answered every model's statistics (found by an independent check); Triton refuses it."""
    assert client.get_inference_statistics("affine", "1").model_stats[0].name == "affine"
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelStatistics(pb.ModelStatisticsRequest(version="1"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "without a model name" in refused.value.details()


def test_a_repository_call_naming_a_repository_is_unimplemented(stub, caplog):
    """One repository is served: as Triton, a call naming one is refused (it was answered from
    the one repository; found by a conformance check). The index too: Triton's gRPC refuses a
    named one, while its HTTP server answers it, ignoring the name (so does HTTP here)."""
    calls = (lambda: stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other")),
             lambda: stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(repository_name="other", model_name="affine")),
             lambda: stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(repository_name="other",
                                                                                model_name="affine")))
    for call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert refused.value.details() == "'repository_name' specification is not supported"
    # what a client on KServe's proto sends (its model_name is field 1, Triton's repository_name)
    with pytest.raises(grpc.RpcError) as refused:
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(repository_name="affine"))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "Its model_name is this field: use Triton's grpc_service.proto" in refused.value.details()
    # an abort inside an @rpc method is its answer, not an internal error (nor grpc's UsageError)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert {m.name for m in stub.RepositoryIndex(pb.RepositoryIndexRequest()).models} >= {"affine"}


def test_a_model_unloaded_on_purpose_is_not_found_whether_a_version_is_named_or_not(client, stub):
    """As over HTTP: a version named was UNAVAILABLE (with a pushback, a retry-later) though only
    a load call serves it again; ModelReady stays false, not an error (as Triton)."""
    client.unload_model("double")
    pinned = ("model double version 1 is not available (unloaded through the repository API: a load call "
              "serves it)")
    infer = pb.ModelInferRequest(model_name="double", model_version="1",
                                 raw_input_contents=[np.zeros((1, 16), np.float32).tobytes()])
    infer.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    try:
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="double"))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert refused.value.details() == "model double has no available versions (unloaded)"
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="double", version="1"))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and refused.value.details() == pinned
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(infer)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and refused.value.details() == pinned
        assert "grpc-retry-pushback-ms" not in dict(refused.value.trailing_metadata())
        assert stub.ModelReady(pb.ModelReadyRequest(name="double", version="1")).ready is False
    finally:
        client.load_model("double")
    assert client.is_model_ready("double", "1")


def test_digits_accuracy_over_grpc(client):
    data = np.load(REPO / "tests" / "data" / "digits_test.npz")
    predictions = []
    for start in range(0, len(data["x"]), 32):  # digits.om's largest gear is 32
        rows = data["x"][start:start + 32].astype(np.float32)
        x = grpcclient.InferInput("x", list(rows.shape), "FP32")
        x.set_data_from_numpy(rows)
        result = client.infer("digits", [x], request_id=str(start))
        assert result.get_response().id == str(start) and result.get_response().model_version == "1"
        predictions.append(result.as_numpy("y").argmax(1))
    accuracy = float(np.mean(np.concatenate(predictions) == data["y"]))
    assert accuracy == pytest.approx(float(data["accuracy"])) and accuracy > 0.97


def test_infer_outputs_versions_and_classification(client, reference):
    want = reference(X, IDX)
    result = client.infer("affine", affine_inputs(), model_version="1")
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("s"), want["s"])
    only = client.infer("affine", affine_inputs(), outputs=[grpcclient.InferRequestedOutput("s")])
    assert [o.name for o in only.get_response().outputs] == ["s"] and only.as_numpy("y") is None
    top = client.infer("affine", affine_inputs(), outputs=[grpcclient.InferRequestedOutput("y", class_count=2)])
    labels = top.as_numpy("y")
    assert labels.shape == (2, 2)
    assert [int(v.decode().split(":")[1]) for v in labels[0]] == list(np.argsort(-want["y"][0])[:2])


def test_typed_contents_give_the_same_answer_as_raw(stub, reference):
    request = pb.ModelInferRequest(model_name="affine", id="typed")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
    x.contents.fp32_contents.extend(X.ravel().tolist())
    idx = request.inputs.add(name="idx", datatype="INT64", shape=[2, 3])
    idx.contents.int64_contents.extend(IDX.ravel().tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["y", "s"]
    assert len(response.raw_output_contents) == 2 and not response.outputs[0].HasField("contents")
    y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(response.outputs[0].shape))
    s = np.frombuffer(response.raw_output_contents[1], np.int64).reshape(2, 3)
    np.testing.assert_allclose(y, reference(X, IDX)["y"], rtol=1e-5)
    np.testing.assert_array_equal(s, reference(X, IDX)["s"])


def test_aio_client_concurrent_requests_and_stream(grpc_server, reference):
    async def scenario():
        async with grpcaio.InferenceServerClient(grpc_server.grpc_url) as c:
            assert await c.is_server_ready() and await c.is_model_ready("affine")
            meta = await c.get_model_metadata("affine", as_json=True)
            assert meta["name"] == "affine"
            xs = [X + i for i in range(16)]
            results = await asyncio.gather(*(c.infer("affine", affine_inputs(x), request_id=str(i))
                                             for i, x in enumerate(xs)))
            for i, r in enumerate(results):
                assert r.get_response().id == str(i)
                np.testing.assert_allclose(r.as_numpy("y"), reference(xs[i], IDX)["y"], rtol=1e-5)

            async def requests():
                for i in range(4):
                    yield {"model_name": "affine", "inputs": affine_inputs(xs[i]), "request_id": f"s{i}"}
                yield {"model_name": "nope", "inputs": affine_inputs(), "request_id": "bad"}

            seen = {}
            async for result, error in c.stream_infer(requests()):
                if error is not None:
                    seen["bad"] = str(error)
                else:
                    seen[result.get_response().id] = result.as_numpy("y")
            assert set(seen) == {"s0", "s1", "s2", "s3", "bad"} and "unknown model" in seen["bad"]
            for i in range(4):
                np.testing.assert_allclose(seen[f"s{i}"], reference(xs[i], IDX)["y"], rtol=1e-5)
    asyncio.run(scenario())


def test_a_client_keeping_150_calls_in_flight_on_one_channel_gets_every_answer(grpc_server, reference):
    """A per-connection cap of 100 calls (grpc.max_concurrent_streams) failed about one call in
    ten "Stream removed" (RST_STREAM REFUSED_STREAM) for such a client: grpc core counts a
    finished call against the cap until its cleanup, so the client, waiting for its own count
    to drop, still went over (found by a differential fuzz of gRPC against HTTP)."""
    client = grpcclient.InferenceServerClient(grpc_server.grpc_url)
    answers: queue.Queue = queue.Queue()
    try:
        for _ in range(3):
            for i in range(150):
                client.async_infer("roomy", affine_inputs(X + i), lambda result, error, i=i: answers.put((i, result, error)))
            for _ in range(150):
                i, result, error = answers.get(timeout=60)
                assert error is None, f"{error.status()} {error.message()}"
                np.testing.assert_allclose(result.as_numpy("y"), reference(X + i, IDX)["y"], rtol=1e-5)
    finally:
        client.close()


def queue_depth(server, model: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30).read().decode()
    depth = {}
    for line in text.splitlines():
        if line.startswith("aclserve_queue_depth{") and f'model="{model}"' in line:
            level = line.split('priority="')[1].split('"')[0]
            depth[level] = float(line.rsplit(" ", 1)[1])
    return depth


def test_priority_parameter_picks_the_queue_level(grpc_server):
    three = (np.ones((3, 8), np.float32), np.ones((3, 3), np.int64))

    async def scenario():
        async with grpcaio.InferenceServerClient(grpc_server.grpc_url) as c:
            first = asyncio.ensure_future(c.infer("slow", affine_inputs(*three), priority=1))
            third = asyncio.ensure_future(c.infer("slow", affine_inputs(*three), priority=3))
            depth = {}
            while depth.get("1") != 1 or depth.get("3") != 1:  # both held: 6 rows fill no gear
                assert not first.done() and not third.done()
                depth = await asyncio.get_running_loop().run_in_executor(None, queue_depth, grpc_server, "slow")
                await asyncio.sleep(0.01)
            assert depth.get("2", 0) == 0
            fill = affine_inputs(np.ones((2, 8), np.float32), np.ones((2, 3), np.int64))
            rest = await c.infer("slow", fill)  # 8 rows in all: the largest gear runs at once
            for r in (await first, await third, rest):
                np.testing.assert_array_equal(r.as_numpy("s"), 2 * np.ones_like(r.as_numpy("s")))
    asyncio.run(scenario())


def test_timeout_parameter_rejects_a_request_still_queued(client):
    three = affine_inputs(np.ones((3, 8), np.float32), np.ones((3, 3), np.int64))
    with pytest.raises(InferenceServerException) as e:
        client.infer("slow", three, timeout=1000)  # 1 ms; 3 rows wait for the 60 s window
    assert e.value.status() == "StatusCode.UNAVAILABLE" and "timed out" in e.value.message()
