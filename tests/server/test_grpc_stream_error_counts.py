"""ModelStreamInfer with `triton_grpc_error: true` (Triton's opt-in: the first failed request ends
the stream): the requests sent after the failed one, whose answers could never be sent, neither
run nor count as successes. A tester found them run, and the statistics count them
differently run to run (5 successes with 1 answer sent, or 3 executions with 1 success), as the
race between the failed request's end of the stream and their runs went."""
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
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.server.grpc_raw import affine
from tests.serving import ServerThread, free_port, server_config

ENDS_ON_ERROR = (("triton_grpc_error", "true"),)


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("stream_error_models")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    # affine (gears 1, 2, 4, 8) holding a partial batch for a minute: 3 rows fill no gear and
    # wait until a request of 1 row makes 4: the test decides when they run
    for name in ("slow", "held"):
        shutil.copy(models_dir / "affine.om", root / f"{name}.om")
        (root / f"{name}.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    with ServerThread(server_config(root, grpc_port=free_port(), request_log=True)) as srv:
        srv.grpc_url = f"127.0.0.1:{srv.config.grpc_port}"
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def stats(server, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/stats", timeout=30) as answer:
        entry = json.loads(answer.read())["model_stats"][0]
    figures = entry["inference_stats"]
    return {"success": figures["success"]["count"], "fail": figures["fail"]["count"],
            "queue": figures["queue"]["count"], "inference_count": entry["inference_count"],
            "execution_count": entry["execution_count"]}


def since(server, model: str, before: dict) -> dict:
    return {key: value - before[key] for key, value in stats(server, model).items()}


def wait_for(condition) -> None:
    for _ in range(3000):  # a hang guard, not a time the test measures
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the server did not get there")


def bad_shape(model: str) -> pb.ModelInferRequest:
    request = affine(1, model, request_id="bad")
    request.inputs[0].shape[1] = 7  # x is [N, 8]
    request.raw_input_contents[0] = bytes(7 * 4)
    return request


def test_requests_after_the_failed_one_do_not_run(server, stub):
    """The first request waits in its queue, so the failed request's status must wait for its
    answer: the four sent after the failed one ran meanwhile, counted successes whose answers
    were dropped. Now nothing after it is read: `success` is the answers sent (and the request
    that let the first run), each round alike."""
    for _ in range(3):
        before = stats(server, "slow")
        requests = [affine(3, "slow", request_id="held"), bad_shape("slow")]
        requests += [affine(1, "slow", request_id=f"after-{i}") for i in range(4)]
        call = stub.ModelStreamInfer(iter(requests), metadata=ENDS_ON_ERROR, timeout=60)
        wait_for(lambda: since(server, "slow", before)["fail"] >= 1)  # the bad request has failed
        stub.ModelInfer(affine(1, "slow", request_id="company"), timeout=60)  # 3 + 1 rows: "held" runs
        answers = []
        with pytest.raises(grpc.RpcError) as ended:
            for response in call:
                answers.append(response.infer_response.id)
        assert answers == ["held"] and ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert since(server, "slow", before) == {"success": 2, "fail": 1, "queue": 2, "inference_count": 4,
                                                 "execution_count": 1}


def test_tritonclient_stream_counts_the_answers_it_got(server):
    """The tester's case: tritonclient's start_stream(headers=...), a request of a wrong shape
    second of six; `success` is the one answer the client got, every time."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(3):
            before = stats(server, "affine")
            answers = queue.Queue()
            client.start_stream(lambda result, error: answers.put((result, error)), headers=dict(ENDS_ON_ERROR))
            try:
                for i in range(6):
                    x = grpcclient.InferInput("x", [1, 7 if i == 1 else 8], "FP32")
                    x.set_data_from_numpy(np.ones((1, 7 if i == 1 else 8), np.float32))
                    idx = grpcclient.InferInput("idx", [1, 3], "INT64")
                    idx.set_data_from_numpy(np.ones((1, 3), np.int64))
                    client.async_stream_infer("affine", [x, idx], request_id=str(i))
                got = [answers.get(timeout=60) for _ in range(2)]
            finally:
                client.stop_stream()
            assert [(result.get_response().id if result else None, error is not None) for result, error in got] == \
                [("0", False), (None, True)]
            assert since(server, "affine", before) == {"success": 1, "fail": 1, "queue": 1, "inference_count": 1,
                                                       "execution_count": 1}
    finally:
        client.close()


def test_a_request_failing_late_cancels_those_after_it(server, stub, caplog):
    """A request that fails in its queue (its `timeout` passed) while one after it waits in a
    queue of its own: that one is taken out of its queue at once, counted failed (its client
    gone) and never run, though the stream still waits for the answer before the failed one.
    Its log line says why (it said "the client went away": a tester, t83)."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    before_slow, before_held = stats(server, "slow"), stats(server, "held")
    late = affine(3, "held", request_id="late")
    late.parameters["timeout"].int64_param = 2_000_000  # 2 s in its queue, then RequestTimeout
    requests = [affine(3, "slow", request_id="first"), late, affine(3, "held", request_id="after")]
    call = stub.ModelStreamInfer(iter(requests), metadata=ENDS_ON_ERROR, timeout=60)
    # "late" timed out and "after" was cancelled, "first" still waiting for company
    wait_for(lambda: since(server, "held", before_held)["fail"] == 2)
    stub.ModelInfer(affine(1, "slow", request_id="company"), timeout=60)
    answers = []
    with pytest.raises(grpc.RpcError) as ended:
        for response in call:
            answers.append(response.infer_response.id)
    assert answers == ["first"] and ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out" in ended.value.details()
    assert since(server, "held", before_held) == {"success": 0, "fail": 2, "queue": 0, "inference_count": 0,
                                                  "execution_count": 0}
    assert since(server, "slow", before_slow)["success"] == 2
    assert logged(caplog, "after") == [
        ("after", 499, "cancelled: the stream ended with an earlier request's error (triton_grpc_error)")]


def logged(caplog, *ids: str) -> list[tuple]:
    """The request log's (request_id, status, error) of the requests named `ids`, in the order logged."""
    return [(r.fields["request_id"], r.fields["status"], r.fields.get("error")) for r in caplog.records
            if r.name == "aclserve.requests" and r.fields["request_id"] in ids]


def test_answers_made_after_the_failed_one_are_logged_unsent(server, stub, caplog):
    """Two requests answered at once while the first waits for company and the one before them
    waits in its queue until its timeout fails it: their answers, made, are let go unsent when it
    fails. They were logged 200 with their send stamps (a tester, t83); now 499, saying why, and
    the answers sent are logged as they are sent, in the stream's order."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    before_affine, before_held = stats(server, "affine"), stats(server, "held")
    late = affine(3, "held", request_id="late")
    late.parameters["timeout"].int64_param = 2_000_000  # 2 s in its queue, then RequestTimeout
    requests = [affine(3, "slow", request_id="first"), late, affine(1, request_id="made-0"),
                affine(1, request_id="made-1")]
    call = stub.ModelStreamInfer(iter(requests), metadata=ENDS_ON_ERROR, timeout=60)
    wait_for(lambda: since(server, "affine", before_affine)["success"] == 2)  # both made, held behind "first"
    assert logged(caplog, "made-0", "made-1") == []  # not sent yet: not logged either
    wait_for(lambda: since(server, "held", before_held)["fail"] == 1)  # "late" timed out
    stub.ModelInfer(affine(1, "slow", request_id="company"), timeout=60)
    with pytest.raises(grpc.RpcError) as ended:
        assert [response.infer_response.id for response in call] == ["first"]
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    unsent = "not sent: the stream ended with an earlier request's error (triton_grpc_error)"
    wait_for(lambda: len(logged(caplog, "first", "late")) == 2)
    assert logged(caplog, "made-0", "made-1", "first", "late") == [
        ("made-0", 499, unsent), ("made-1", 499, unsent), ("first", 200, None),
        ("late", 503, logged(caplog, "late")[0][2])]
    assert logged(caplog, "late")[0][2].startswith("request timed out after")


def test_an_answer_waiting_for_the_one_before_it_is_logged_when_sent(server, stub, caplog):
    """An answer made at once waits on the stream for the one before it: its log line (its
    duration, and a trace's send stamps) ends when it is sent, after that one's, not when it is
    made (a tester saw 1.6 ms logged for an answer that left after 37)."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    before = stats(server, "affine")
    requests = [affine(3, "slow", request_id="waits"), affine(1, request_id="quick")]
    call = stub.ModelStreamInfer(iter(requests), timeout=60)
    wait_for(lambda: since(server, "affine", before)["success"] == 1)  # "quick" made
    assert logged(caplog, "waits", "quick") == []
    stub.ModelInfer(affine(1, "slow", request_id="company"), timeout=60)
    assert [response.infer_response.id for response in call] == ["waits", "quick"]
    assert logged(caplog, "waits", "quick") == [("waits", 200, None), ("quick", 200, None)]
