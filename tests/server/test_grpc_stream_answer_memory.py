"""What a ModelStreamInfer stream holds for a client that does not read its answers: each answer
charged to the memory budget until grpc takes it, and a failed request's answer small. A tester
found error answers echoing the request's model_name and id whole and uncharged: 4 streams of
64 requests with 3.5 MB names, never read, took the server from 115 MB to 1.9 GB while
aclserve_request_memory_bytes stayed 0. A real server, grpc.aio streams that read nothing until
the test has looked: their answers wait behind a first request queued in "slow" (it runs once a
unary call fills its batch), so what the server holds is the answers of the requests after it."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.server.grpc_wire import ECHOED_CHARS
from tests.serving import free_port, server_config, started_with_grpc

from .grpc_raw import STREAM, affine
from .grpc_stubs import stubs
from .hostile import metric, wait_for
from .test_grpc_guards import MiB, in_use, with_slow

REQUESTS = 16  # requests of a stream held behind its first
SLOW_DEPTH = 'model="slow",priority="2",version="1"'  # its queue's depth, at the default priority level


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    """Messages of up to 4 MiB (a request of three 1 MiB names)."""
    yield from started_with_grpc(server_config(with_slow(models_dir, tmp_path_factory.mktemp("stream_answers")),
                                               grpc_port=free_port(), model_control_mode="none",
                                               max_body_bytes=4 * MiB, grpc_max_message_bytes=4 * MiB))


def outcomes(srv, model: str = "affine") -> tuple[int, int]:
    """(successes, failures) of `model`, as its statistics count them."""
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/{model}/stats", timeout=30) as answer:
        stats = [s["inference_stats"] for s in json.loads(answer.read())["model_stats"]]
    return sum(s["success"]["count"] for s in stats), sum(s["fail"]["count"] for s in stats)


def serialized(request) -> bytes:
    """A request message's bytes (a test's made by hand are already)."""
    return request if isinstance(request, bytes) else request.SerializeToString()


def held_behind_a_queued_request(srv, requests, answered=None):
    """Send `requests` (messages, or their bytes) on a stream after one that waits in "slow"'s
    queue, reading nothing; once `answered()` says they are answered (each is, held in order
    behind the first), the memory charged then beyond the first's; then the first one's batch is
    filled and every answer read: (charged, the answers after the first)."""
    async def scenario():
        async with grpc.aio.insecure_channel(srv.grpc_url) as channel:
            call = channel.stream_stream(STREAM, serialized, pb.ModelStreamInferResponse.FromString)()
            await call.write(affine(3, model="slow", request_id="waits"))  # 3 rows fill no gear of 1, 2, 4, 8
            await wait_for(lambda: metric(srv.url, "aclserve_queue_depth", SLOW_DEPTH) == 1)
            before = in_use(srv)  # the waiting request's charge
            for request in requests:
                await call.write(request)
            charged = None
            if answered is not None:
                await wait_for(answered)
                charged = in_use(srv) - before
            infer, _ = stubs(channel)
            await infer(affine(5, model="slow"))  # 8 rows: the waiting request runs
            answers = [await asyncio.wait_for(call.read(), 30) for _ in range(len(requests) + 1)]  # a hang guard
            await call.done_writing()
            return charged, answers
    charged, answers = asyncio.run(scenario())
    assert answers[0].infer_response.id == "waits" and not answers[0].error_message
    return charged, answers[1:]


def test_a_failed_requests_answer_is_small_and_charged_until_taken(srv):
    """Requests of 1 MiB ids that fail once parsed (no inputs): their answers echo the first 256
    characters of the id and keep the part of their request's charge they hold (they held 1 MiB
    each, uncharged, when the charge went back on the failure)."""
    _, failed = outcomes(srv)
    requests = [pb.ModelInferRequest(model_name="affine", id=f"{i:02}" + "i" * MiB) for i in range(REQUESTS)]
    charged, answers = held_behind_a_queued_request(srv, requests, lambda: outcomes(srv)[1] == failed + REQUESTS)
    for i, answer in enumerate(answers):
        assert "inputs must not be empty" in answer.error_message
        assert answer.infer_response.id == (f"{i:02}" + "i" * MiB)[:ECHOED_CHARS]
        assert answer.ByteSize() < 1024
    assert charged >= sum(answer.ByteSize() for answer in answers), "answers held uncharged"
    assert charged < REQUESTS * 8 * 1024, "the requests' messages stayed charged"  # 16 MiB of them came
    asyncio.run(wait_for(lambda: in_use(srv) == 0))


def test_a_refused_requests_answer_echoes_its_names_cut(srv):
    """Names no model or version has, of 1 MiB each: refused (unknown model, a version too long
    to be one), answered with their first 256 characters, not 3 MiB an answer."""
    requests = [pb.ModelInferRequest(model_name="m" * MiB, model_version="7" * MiB, id="i" * MiB),
                pb.ModelInferRequest(model_name="affine", model_version="7" * MiB, id="j" * MiB)]
    _, answers = held_behind_a_queued_request(srv, requests)
    assert "unknown model" in answers[0].error_message and "positive integer" in answers[1].error_message
    for answer, request in zip(answers, requests):
        names = answer.infer_response
        assert (names.model_name, names.model_version, names.id) == (
            request.model_name[:ECHOED_CHARS], request.model_version[:ECHOED_CHARS], request.id[:ECHOED_CHARS])
        assert answer.ByteSize() < 2048
    asyncio.run(wait_for(lambda: in_use(srv) == 0))


def test_a_successful_answer_echoes_the_whole_id_within_its_requests_charge(srv):
    """A served request's answer echoes its id whole (as Triton does); its request's charge, held
    until grpc takes the answer, counts the message that brought the id, so it covers the answer."""
    succeeded, _ = outcomes(srv)
    requests = [affine(1, request_id=f"{i:02}" + "s" * MiB) for i in range(REQUESTS)]
    charged, answers = held_behind_a_queued_request(srv, requests, lambda: outcomes(srv)[0] == succeeded + REQUESTS)
    assert [answer.infer_response.id for answer in answers] == [request.id for request in requests]
    assert not any(answer.error_message for answer in answers)
    assert charged >= sum(answer.ByteSize() for answer in answers)
    asyncio.run(wait_for(lambda: in_use(srv) == 0))
