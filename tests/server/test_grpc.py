"""The gRPC endpoint on a real port, driven by tritonclient.grpc (sync and aio) and by the raw
generated stub for what tritonclient cannot send (typed `contents`)."""
import asyncio
import json
import logging
import queue
import shutil
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

from tests import REPO
from tests.serving import ServerThread, free_port, server_config

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


@pytest.fixture(scope="module")
def grpc_models(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_models")
    for name in ("affine", "double"):
        shutil.copy(models_dir / f"{name}.om", root / f"{name}.om")
    shutil.copy(REPO / "models" / "digits.om", root / "digits.om")
    # "slow": affine (gears 1,2,4,8) with a partial batch held for a minute: 3 or 6 queued rows
    # fill no gear, so they wait until 8 rows arrive: the test decides when a batch runs
    shutil.copy(models_dir / "affine.om", root / "slow.om")
    (root / "slow.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    shutil.copy(models_dir / "affine.om", root / "roomy.om")  # a queue for 150 calls at once
    (root / "roomy.yaml").write_text("batching: {default_queue_policy: {max_queue_size: 200}}\n")
    return root


@pytest.fixture(scope="module")
def grpc_server(grpc_models):
    with ServerThread(server_config(grpc_models, grpc_port=free_port())) as srv:
        srv.grpc_url = f"127.0.0.1:{srv.config.grpc_port}"
        yield srv


@pytest.fixture(scope="module")
def client(grpc_server):
    c = grpcclient.InferenceServerClient(grpc_server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(grpc_server):
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def affine_inputs(x=X, idx=IDX):
    a = grpcclient.InferInput("x", list(x.shape), "FP32")
    a.set_data_from_numpy(x)
    b = grpcclient.InferInput("idx", list(idx.shape), "INT64")
    b.set_data_from_numpy(idx)
    return [a, b]


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


def test_sync_stream(client, reference):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(3):
            client.async_stream_infer("affine", affine_inputs(X * i), request_id=str(i))
        got = {}
        for _ in range(3):
            result, error = answers.get(timeout=60)
            assert error is None
            got[result.get_response().id] = result.as_numpy("y")
    finally:
        client.stop_stream()
    assert set(got) == {"0", "1", "2"}
    for i in range(3):  # each request answered with its own rows
        np.testing.assert_allclose(got[str(i)], reference(X * i, IDX)["y"], rtol=1e-5, atol=1e-6)


def successes(server, model: str) -> int:
    url = f"http://{server.url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())["model_stats"][0]["inference_stats"]["success"]["count"]


def test_stream_answers_come_in_the_order_of_the_requests(grpc_server, client):
    """As Triton's: a request held in its queue holds back the answers of the requests after
    it, though they were made first (an error among them too, whose id tritonclient drops):
    a client pairs answers with requests by position."""
    held = affine_inputs(np.ones((3, 8), np.float32), np.ones((3, 3), np.int64))  # 3 rows fill no gear
    fill = affine_inputs(np.ones((5, 8), np.float32), np.ones((5, 3), np.int64))  # 8 in all: runs at once
    answers = queue.Queue()
    before = successes(grpc_server, "affine")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("slow", held, request_id="held")
        client.async_stream_infer("affine", affine_inputs(X), request_id="fast")
        client.async_stream_infer("nope", affine_inputs(X), request_id="bad")
        for _ in range(3000):  # a hang guard: until "fast" has been answered by the model
            if successes(grpc_server, "affine") > before:
                break
            time.sleep(0.01)
        assert answers.empty()  # made, but behind "held"
        client.async_stream_infer("slow", fill, request_id="fill")
        got = [answers.get(timeout=60) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [result.get_response().id if error is None else "error" for result, error in got] == \
        ["held", "fast", "error", "fill"]
    assert "unknown model" in str(got[2][1])


def test_each_stream_response_is_marked_final(client):
    """Clients that set tritonclient's enable_empty_final_response wait for a response marked
    triton_final_response, which Triton puts on every stream response (true for the last of a
    request): every model here answers each request once, so each is marked, errors too."""
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("affine", affine_inputs(X), request_id="flag", enable_empty_final_response=True)
        client.async_stream_infer("affine", affine_inputs(X), request_id="plain")
        got = {}
        for _ in range(2):
            result, error = answers.get(timeout=60)
            assert error is None
            got[result.get_response().id] = result.get_response().parameters
    finally:
        client.stop_stream()
    assert got["flag"]["triton_final_response"].bool_param is True
    assert got["plain"]["triton_final_response"].bool_param is True


def typed_affine_request(request_id: str, model: str = "affine", rows: int = 2) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    x = request.inputs.add(name="x", datatype="FP32", shape=[rows, 8])
    x.contents.fp32_contents.extend(X[:1].ravel().tolist() * rows)
    idx = request.inputs.add(name="idx", datatype="INT64", shape=[rows, 3])
    idx.contents.int64_contents.extend([0, 1, 2] * rows)
    return request


@pytest.mark.parametrize("bad, code", [(dict(model="nope"), grpc.StatusCode.NOT_FOUND),
                                       (dict(rows=99), grpc.StatusCode.INVALID_ARGUMENT)], ids=["unknown", "rows"])
def test_triton_grpc_error_ends_the_stream_with_the_first_error_status(stub, bad, code):
    """Triton's opt-in (metadata `triton_grpc_error: true`): the answers before the first failed
    request come as usual, then the stream ends with that request's status and message; the
    request after it is not answered. Without the metadata the error is an answer (above)."""
    requests = [typed_affine_request("first"), typed_affine_request("bad", **bad), typed_affine_request("after")]
    call = stub.ModelStreamInfer(iter(requests), metadata=(("triton_grpc_error", "true"),), timeout=60)
    answers = []
    with pytest.raises(grpc.RpcError) as ended:
        for response in call:
            answers.append(response)
    assert [(a.error_message, a.infer_response.id) for a in answers] == [("", "first")]
    assert ended.value.code() == code
    assert ("unknown model" if code == grpc.StatusCode.NOT_FOUND else "99") in ended.value.details()
    # the same requests without the metadata: three answers, the second an error
    plain = list(stub.ModelStreamInfer(iter(requests), timeout=60))
    assert [bool(a.error_message) for a in plain] == [False, True, False]


def test_triton_grpc_error_on_an_open_stream_logs_no_error(client, caplog):
    """The client keeps its side open (tritonclient does until stop_stream): the abort failed the
    stream's reader, waiting for a message, and each such stream logged "Task exception was
    never retrieved" with a traceback at the next collection (a review)."""
    import gc
    for _ in range(10):
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            headers={"triton_grpc_error": "true"})
        try:
            client.async_stream_infer("affine", affine_inputs(X), request_id="good")
            assert answers.get(timeout=60)[1] is None
            client.async_stream_infer("nope", affine_inputs(X), request_id="bad")
            _, error = answers.get(timeout=60)
            assert error is not None and "StatusCode.NOT_FOUND" in str(error.status())
        finally:
            client.stop_stream()
    for _ in range(20):  # the calls' objects go at the server's pace: collect a few times
        gc.collect()
        time.sleep(0.05)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
@pytest.mark.parametrize("model", ["affine", "nosuch", "m" * 300], ids=["wrong shape", "unknown model", "long name"])
def test_refused_requests_are_not_kept_alive_by_their_errors(stub, stream, model):
    """A stream keeps each failed request's error (to end the stream with it when asked): with
    its traceback, whose frames held the request, a cycle that only a full collection frees (300
    refused 5 MB requests held 1.6 GB; a review). A request refused by its model's lookup before
    it was charged did so too, unary or streamed: the lookup's error, kept by the refusal, held the
    frames holding it (a reviewer: 44 MB). With the collector off, 100 refused 900 KB requests
    must not hold their 88 MB (this server's messages are at most 1 MiB)."""
    import gc
    import resource

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    big = pb.ModelInferRequest(model_name=model, id="big")  # affine: a wrong shape, refused after parsing
    x = big.inputs.add(name="x", datatype="FP32", shape=[1, 225 * 1024])
    big.raw_input_contents.append(bytes(900 * 1024))
    x.parameters["note"].string_param = "refused"

    def refused(count: int) -> list[str]:
        if stream:
            return [a.error_message for a in stub.ModelStreamInfer(iter([big] * count), timeout=60)]
        errors = []
        for _ in range(count):
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(big, timeout=60)
            errors.append(e.value.details())
        return errors
    refused(1)  # (warm: the first one's buffers stay)
    gc.collect()
    gc.disable()
    try:
        before = rss_mb()
        errors = refused(100)
        grown = rss_mb() - before
    finally:
        gc.enable()
    assert len(errors) == 100 and all(errors)
    assert grown < 44, f"RSS grew {grown:.0f} MB for 100 refused 900 KB requests"


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
