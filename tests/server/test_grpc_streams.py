"""gRPC's ModelStreamInfer on a real port (the grpc_server fixture: conftest.py), driven by
tritonclient.grpc and the raw generated stub: answers in the order of the requests, each marked
final, Triton's triton_grpc_error opt-in ending a stream at its first error, and refused requests
(streamed or unary) not kept alive by their errors."""
import json
import logging
import queue
import time
import urllib.request

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from .grpc_inputs import IDX, X, affine_inputs


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
