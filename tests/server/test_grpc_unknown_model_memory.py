"""A gRPC request naming a model the repository does not know is charged to the memory budget
alone, not as that name's: its message's model_name was the lease's model before the server
looked it up, so the name showed as a label of aclserve_request_memory_model_bytes, and its
requests could be refused for that name's share (UNAVAILABLE) instead of NOT_FOUND. A real
server; the refused requests' answers wait in a stream behind one queued in "slow" (held, each
with its charge, until the test fills that batch: test_grpc_stream_answer_memory.py)."""
from __future__ import annotations

import asyncio

import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.server.grpc_service import ANSWER_OBJECTS_BYTES
from tests.serving import free_port, server_config, started_with_grpc

from .hostile import wait_for
from .test_grpc_guards import in_use, with_slow
from .test_grpc_stream_answer_memory import held_behind_a_queued_request
from .test_model_share import by_model

KiB = 1 << 10
SHARE = 64 * KiB
REQUESTS = 24  # each answer holds about ANSWER_OBJECTS_BYTES of its request's charge: more than SHARE in all


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    """Three models served, a share of 64 KiB each (a request's limit too) in a 1 MiB budget."""
    yield from started_with_grpc(server_config(
        with_slow(models_dir, tmp_path_factory.mktemp("unknown_model_memory")), grpc_port=free_port(),
        model_control_mode="none", max_inflight_bytes=1 << 20, max_request_bytes=SHARE,
        max_inflight_bytes_per_model=SHARE, max_body_bytes=SHARE, max_json_bytes=SHARE,
        grpc_max_message_bytes=SHARE))


def test_requests_naming_no_model_are_not_found_and_hold_no_models_share(srv):
    """24 requests naming "ghost" held as answers (more than a share's worth between them): each
    is NOT_FOUND's "unknown model", none refused for ghost's share, and ghost is no label of the
    per-model gauge while they are held."""
    seen = {}

    def held_enough():  # (the waiting request's few bytes aside)
        if in_use(srv) < (REQUESTS // 2) * ANSWER_OBJECTS_BYTES:
            return False
        seen.update(by_model(srv))
        return True

    # (an id of 4 KiB: a refused request's answer keeps no more of its charge than its message brought)
    requests = [pb.ModelInferRequest(model_name="ghost", id=f"{i:02}" + "i" * 4 * KiB) for i in range(REQUESTS)]
    _, answers = held_behind_a_queued_request(srv, requests, held_enough)
    assert [answer.error_message for answer in answers] == ["unknown model 'ghost'"] * REQUESTS
    assert "ghost" not in seen and set(seen) <= {"slow"}, seen
    asyncio.run(wait_for(lambda: in_use(srv) == 0))
