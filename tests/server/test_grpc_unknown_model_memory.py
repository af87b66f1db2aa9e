"""A gRPC request naming a model or version the repository does not have is refused before any of
it is charged to the memory budget, as HTTP looks its path's model up before it reads the body:
NOT_FOUND whatever the budget holds (it was UNAVAILABLE, the budget's refusal, while the budget
was full), logged as any NOT_FOUND is. Before that, its message's model_name was the lease's model
and showed as a label of aclserve_request_memory_model_bytes. A real server, the request log on;
the budget filled by stalled HTTP uploads, stream answers held behind a request queued in "slow"
(until the test fills that batch: test_grpc_stream_answer_memory.py)."""
from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.serving import free_port, server_config, started_with_grpc

from .hostile import stalled_upload, wait_for
from .test_grpc_guards import in_use, refused, stubs, with_slow
from .test_grpc_stream_answer_memory import held_behind_a_queued_request
from .test_model_share import by_model

KiB = 1 << 10
REQUEST = 256 * KiB
BUDGET = 4 * REQUEST
REQUESTS = 24


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    """A 1 MiB budget that one model's requests may fill, 256 KiB a request; requests logged."""
    yield from started_with_grpc(server_config(
        with_slow(models_dir, tmp_path_factory.mktemp("unknown_model_memory")), grpc_port=free_port(),
        model_control_mode="none", request_log=True, max_inflight_bytes=BUDGET, max_request_bytes=REQUEST,
        max_inflight_bytes_per_model=BUDGET, max_body_bytes=REQUEST, max_json_bytes=REQUEST,
        grpc_max_message_bytes=REQUEST))


def logged(caplog) -> list[tuple]:
    """The request log's gRPC lines (the uploads' are HTTP's)."""
    return [(r.fields["request_id"], r.fields["model"], r.fields["version"], r.fields["status"], r.fields["error"])
            for r in caplog.records if r.name == "aclserve.requests" and r.fields["protocol"] == "grpc"]


REFUSALS = [  # (request, status, what its answer and log line say)
    (pb.ModelInferRequest(model_name="nosuch", id="n-1"), grpc.StatusCode.NOT_FOUND, "unknown model 'nosuch'"),
    (pb.ModelInferRequest(model_name="affine", model_version="9", id="n-2"), grpc.StatusCode.NOT_FOUND,
     "model affine has no version 9"),
    (pb.ModelInferRequest(model_name="affine", model_version="x", id="n-3"), grpc.StatusCode.INVALID_ARGUMENT,
     "version must be a positive integer, got 'x'"),
]


def test_a_request_naming_no_model_is_not_found_while_the_budget_is_full(srv, caplog):
    """The budget filled but for 4 bytes by four uploads stalled before their last byte: requests
    naming an unknown model or version get what they get with the budget free, and are logged
    the same, none refused by the budget."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")

    async def refusals():
        async with grpc.aio.insecure_channel(srv.grpc_url) as channel:
            infer, _ = stubs(channel)
            errors = []
            for request, _, _ in REFUSALS:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await infer(request)
                errors.append((e.value.code(), e.value.details()))
            return errors

    async def scenario():
        free = await refusals()
        uploads = [await stalled_upload(srv.url, REQUEST) for _ in range(4)]
        assert in_use(srv) >= BUDGET - 4
        full = await refusals()
        for _, writer in uploads:
            writer.close()
        await wait_for(lambda: in_use(srv) == 0)
        return free, full
    refused_before = refused(srv, 503)
    free, full = asyncio.run(scenario())
    assert full == free == [(status, said) for _, status, said in REFUSALS]
    assert refused(srv, 503) == refused_before
    lines = [(request.id, request.model_name, request.model_version, 400 if "version must" in said else 404, said)
             for request, _, said in REFUSALS]
    assert logged(caplog) == lines + lines


def test_streamed_requests_naming_no_model_hold_no_charge(srv, caplog):
    """24 requests naming "ghost" answered on a stream, their answers held: each is NOT_FOUND's
    "unknown model", none of them charged (ghost no label of the per-model gauge)."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    seen = {}

    def answered():
        if sum(line[1] == "ghost" for line in logged(caplog)) < REQUESTS:
            return False
        seen.update(by_model(srv))
        return True

    requests = [pb.ModelInferRequest(model_name="ghost", id=f"{i:02}" + "i" * 4 * KiB) for i in range(REQUESTS)]
    charged, answers = held_behind_a_queued_request(srv, requests, answered)
    assert [answer.error_message for answer in answers] == ["unknown model 'ghost'"] * REQUESTS
    assert charged == 0 and set(seen) <= {"slow"}, (charged, seen)
    asyncio.run(wait_for(lambda: in_use(srv) == 0))
