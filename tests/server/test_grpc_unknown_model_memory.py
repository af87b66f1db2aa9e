"""A gRPC request the repository's lookup refuses is refused before any of it is charged to the
memory budget, as HTTP looks its path's model up before it reads the body, whatever the budget
holds: a model or version the repository has not NOT_FOUND (a name too long for any model's too,
saying its length), a model not ready UNAVAILABLE with its own message, logged as any such
refusal is; so is one whose name is not UTF-8, INVALID_ARGUMENT as protobuf refuses it, and one
naming no model, INVALID_ARGUMENT. While
the budget was full they got its UNAVAILABLE instead; one naming no model showed its model_name as
a label of aclserve_request_memory_model_bytes, one naming a model loading held a charge on its
model's share. A real server in poll mode, the request log on; the budget filled by stalled HTTP
uploads, stream answers held behind a request queued in "slow" (until the test fills that batch:
test_grpc_stream_answer_memory.py)."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.protobuf_wire import len_field
from tests.serving import free_port, server_config, started_with_grpc

from .grpc_raw import INFER, answers_made
from .hostile import stalled_upload, wait_for
from .test_grpc_guards import in_use, refused, with_slow
from .test_grpc_stream_answer_memory import held_behind_a_queued_request
from .test_model_share import by_model

KiB = 1 << 10
REQUEST = 256 * KiB
BUDGET = 4 * REQUEST
REQUESTS = 24
WAITING = "model fresh is not ready (UNAVAILABLE: waiting for the file to be complete)"
NOT_UTF8 = ("request message is not a valid ModelInferRequest: "  # (protobuf's words)
            "Error parsing message with type 'inference.ModelInferRequest'")


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    """A 1 MiB budget that one model's requests may fill, 256 KiB a request; requests logged.
    "fresh", copied in as the server starts, waits an hour (settle_s) for its file to be complete:
    UNAVAILABLE all along."""
    root = with_slow(models_dir, tmp_path_factory.mktemp("unknown_model_memory"))
    for path in root.iterdir():
        os.utime(path, (1, 1))  # old files: served at once
    shutil.copy(models_dir / "affine.om", root / "fresh.om")
    yield from started_with_grpc(server_config(
        root, grpc_port=free_port(), model_control_mode="poll", settle_s=3600, request_log=True,
        max_inflight_bytes=BUDGET, max_request_bytes=REQUEST, max_inflight_bytes_per_model=BUDGET,
        max_body_bytes=REQUEST, max_json_bytes=REQUEST, grpc_max_message_bytes=REQUEST))


def logged(caplog) -> list[tuple]:
    """The request log's gRPC lines (the uploads' are HTTP's)."""
    return [(r.fields["request_id"], r.fields["model"], r.fields["version"], r.fields["status"], r.fields["error"])
            for r in caplog.records if r.name == "aclserve.requests" and r.fields["protocol"] == "grpc"]


def message(model: str, version: str = "", request_id: str = "", **raw_names: bytes) -> bytes:
    """A ModelInferRequest's bytes, its names replaced by `raw_names`' bytes (model_name=..., model_version=...)."""
    sent = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id).SerializeToString()
    return sent + b"".join(len_field(1 if name == "model_name" else 2, raw) for name, raw in raw_names.items())


LONG = "m" * 300
REFUSALS = [  # (message, status, what its answer says, its request log line: (model, version, status) or None)
    (message("nosuch", "", "n-1"), grpc.StatusCode.NOT_FOUND, "unknown model 'nosuch'", ("nosuch", "", 404)),
    (message("affine", "9", "n-2"), grpc.StatusCode.NOT_FOUND, "model affine has no version 9", ("affine", "9", 404)),
    (message("affine", "x", "n-3"), grpc.StatusCode.INVALID_ARGUMENT, "version must be a positive integer, got 'x'",
     ("affine", "x", 400)),
    (message("fresh", "", "n-4"), grpc.StatusCode.UNAVAILABLE, WAITING, ("fresh", "", 503)),
    (message(LONG, "", "n-5"), grpc.StatusCode.NOT_FOUND, "unknown model: a name of 300 characters (at most 128)",
     (LONG[:256] + "... (44 more characters)", "", 404)),
    (message("affine", "7" * 300, "n-6"), grpc.StatusCode.INVALID_ARGUMENT,
     "version must be a positive integer of at most 18 digits",
     ("affine", "7" * 256 + "... (44 more characters)", 400)),
    (message("affine", "", "n-7", model_name=b"n\xff"), grpc.StatusCode.INVALID_ARGUMENT, NOT_UTF8, None),
    (message("affine", "", "n-8", model_version=b"1\xc0\x80"), grpc.StatusCode.INVALID_ARGUMENT, NOT_UTF8, None),
    (message("", "", "n-9"), grpc.StatusCode.INVALID_ARGUMENT, "model name must not be empty", None),
]


def test_a_request_its_lookup_refuses_is_answered_alike_while_the_budget_is_full(srv, caplog):
    """The budget filled but for 4 bytes by four uploads stalled before their last byte: requests
    naming an unknown model or version, a model not ready, names too long for any model's or not
    UTF-8 get what they get with the budget free, and are logged the same, none refused by the
    budget."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")

    async def refusals():
        async with grpc.aio.insecure_channel(srv.grpc_url) as channel:
            infer = channel.unary_unary(INFER)  # (bytes sent as they are)
            errors = []
            for sent, _, _, _ in REFUSALS:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await infer(sent)
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
    assert full == free == [(status, said) for _, status, said, _ in REFUSALS]
    assert refused(srv, 503) == refused_before
    lines = [(f"n-{i}", *line[:2], line[2], said) for i, (_, _, said, line) in enumerate(REFUSALS, 1) if line]
    assert logged(caplog) == lines + lines


def test_streamed_requests_their_lookup_refuses_hold_no_charge(srv, caplog):
    """24 requests answered on a stream, their answers held, each refused before it was charged:
    naming "ghost", "fresh" (not ready), a name too long or not UTF-8; each answered as it is
    alone, none of them charged ("ghost" and "fresh" no labels of the per-model gauge)."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    kinds = [  # (model_name, model_version, bytes of a model_name after it that are not UTF-8, the answer)
        ("affine", "", b"\xff", NOT_UTF8), ("fresh", "", None, WAITING),
        ("affine", "7" * 300, None, "version must be a positive integer of at most 18 digits"),
        (LONG, "", None, "unknown model: a name of 300 characters (at most 128)"),
        ("ghost", "", None, "unknown model 'ghost'")]
    chosen = [kinds[i % len(kinds)] for i in range(REQUESTS)]
    requests = [message(model, version, f"{i:02}" + "i" * 4 * KiB, **({"model_name": raw} if raw else {}))
                for i, (model, version, raw, _) in enumerate(chosen)]
    seen = {}

    def answered():
        if not answers_made(REQUESTS)():
            return False
        seen.update(by_model(srv))
        return True

    charged, answers = held_behind_a_queued_request(srv, requests, answered)
    assert [answer.error_message for answer in answers] == [said for *_, said in chosen]
    assert charged == 0 and set(seen) <= {"slow"}, (charged, seen)
    asyncio.run(wait_for(lambda: in_use(srv) == 0))
    # logged as their answers were sent (those not UTF-8, naming no model it can read, are not)
    refusals = [r for r in caplog.records if r.name == "aclserve.requests" and r.fields["status"] != 200]
    assert len(refusals) == sum(raw is None for _, _, raw, _ in chosen)
