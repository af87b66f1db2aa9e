"""The HTTP guards over gRPC: the memory budget (charged before a message is parsed), the
connection cap, the message, handshake and idle timeouts. A real server on real ports, driven by
grpc.aio channels and, for what no gRPC client sends (half a message, a silent connection), raw
HTTP/2 frames on a socket. The call cap, and shutdown past a stalled client: test_grpc_call_slots.py."""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import struct
import time
import urllib.request

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.server.grpc_arrivals import MIN_SLOTS
from tests.serving import ServerThread, free_port, server_config, started_with_grpc

from .grpc_raw import (DATA, GOAWAY, HEADERS, INFER, PREFACE, RST_STREAM, SETTINGS, STREAM, affine, call_headers, frame,
                       frames_until_closed)
from .grpc_stubs import stalled_infer, stubs
from .hostile import metric, wait_for

MiB = 1 << 20


# -- a server with a small budget ------------------------------------------------------------------

def with_slow(models_dir, root):
    """affine and double, and "slow", which holds a partial batch (3 rows) until 8 rows are
    queued, so a test decides when a charged request ends."""
    for name in ("affine", "double"):
        shutil.copy(models_dir / f"{name}.om", root / f"{name}.om")
    shutil.copy(models_dir / "affine.om", root / "slow.om")
    (root / "slow.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    return root


@pytest.fixture(scope="module")
def guarded(models_dir, tmp_path_factory):
    """Messages of 4 MiB (four arriving at once: a 16 MiB budget), 3 MiB per request, 4 calls
    and 4 connections at once, half-second timeouts; the models of with_slow."""
    root = with_slow(models_dir, tmp_path_factory.mktemp("grpc_guards"))
    yield from started_with_grpc(server_config(
        root, grpc_port=free_port(), model_control_mode="none", max_body_bytes=4 * MiB,
        grpc_max_message_bytes=4 * MiB, max_request_bytes=3 * MiB, max_inflight_bytes=16 * MiB, max_connections=4,
        body_timeout_s=0.5, header_timeout_s=0.5, keepalive_timeout_s=0.5))


def in_use(srv) -> float:
    return metric(srv.url, "aclserve_request_memory_bytes")


def inferences(srv, model: str = "affine") -> int:
    """Requests of `model` its versions ran (the statistics extension's inference_count)."""
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/{model}/stats", timeout=30) as answer:
        return sum(stats["inference_count"] for stats in json.loads(answer.read())["model_stats"])


def refused(srv, status: int) -> float:
    return metric(srv.url, "aclserve_request_memory_refused_total", f'status="{status}"')


def test_a_request_over_max_request_bytes_alone_is_resource_exhausted(guarded):
    big = affine(1)
    big.raw_input_contents[0] = bytes(3 * MiB + 1)  # wrong for the shape: refused before that is looked at
    varints = affine(1, typed=True)
    varints.inputs[1].contents.int64_contents.extend([1] * 200_000)  # 200 KB that parse to 16x as much

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            infer, _ = stubs(channel)
            errors = []
            for request in (big, varints):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await infer(request)
                errors.append(e.value)
            return errors, await infer(affine(2))
    before = refused(guarded, 413)
    errors, served = asyncio.run(scenario())
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_bytes" in e.details()
               for e in errors), [e.details() for e in errors]
    assert "its message" in errors[0].details() and "parsing and decoding" in errors[1].details()
    # the advice to send raw_input_contents goes to the request that sent typed contents only
    assert errors[0].details().endswith("; send smaller requests"), errors[0].details()
    assert "raw_input_contents rather than typed contents" in errors[1].details()
    assert np.frombuffer(served.raw_output_contents[1], np.int64).tolist() == [2] * 6  # others are served
    assert refused(guarded, 413) == before + 2 and in_use(guarded) == 0


def test_requests_over_the_budget_in_use_are_unavailable_and_it_comes_back_to_zero(models_dir, tmp_path):
    """A 4 MiB budget and messages of 1 MiB (four arriving at once). Four 0.9 MiB requests of 3,
    2, 1 and 1 rows wait in "slow"'s queue holding their leases (7 rows: no gear filled): 0.9 MiB
    requests do not fit what is left (UNAVAILABLE with a retry pushback, refused before parsing),
    a small one does; once the held requests are answered the budget is back to 0."""
    # (one model's requests fill the budget here: a model's share as large as it, test_model_share.py has the share)
    config = server_config(with_slow(models_dir, tmp_path), grpc_port=free_port(), model_control_mode="none",
                           max_request_bytes=MiB, max_inflight_bytes=4 * MiB, max_inflight_bytes_per_model=4 * MiB)
    held = [affine(rows, model="slow", request_id=f"h{rows}" * (MiB * 9 // 20)) for rows in (3, 2, 1, 1)]  # big ids
    large = affine(1, request_id="l" * (MiB * 9 // 10))

    async def scenario(srv):
        async with grpc.aio.insecure_channel(srv.grpc_url) as channel:
            infer, _ = stubs(channel)
            waiting = []
            for request in held:  # one by one: in this order no prefix of them fills a gear
                waiting.append(asyncio.ensure_future(infer(request)))
                await wait_for(lambda: in_use(srv) >= len(waiting) * len(request.id))
            outcomes = await asyncio.gather(*[infer(large) for _ in range(2)], return_exceptions=True)
            small = await infer(affine(1))
            fill = await infer(affine(1, model="slow"))  # 8 rows: the held batch runs
            answered = await asyncio.gather(*waiting)
            await wait_for(lambda: in_use(srv) == 0)
            return outcomes, small, fill, answered
    with ServerThread(config) as srv:
        srv.grpc_url = f"127.0.0.1:{config.grpc_port}"
        outcomes, small, fill, answered = asyncio.run(scenario(srv))
        assert refused(srv, 503) == 2
        assert metric(srv.url, "aclserve_request_memory_peak_bytes") <= 4 * MiB
    for e in outcomes:
        assert isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert "max_inflight_bytes" in e.details()
        assert dict(e.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert len(small.raw_output_contents) == 2 and len(fill.raw_output_contents) == 2
    assert [a.id for a in answered] == [h.id for h in held]


def test_a_streamed_request_is_charged_alone_and_its_refusal_names_it(guarded):
    big = affine(1, request_id="too-big")
    big.raw_input_contents[0] = bytes(3 * MiB + 1)

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)
            call = stream()
            await call.write(big)
            first = await call.read()
            await call.write(affine(2, request_id="fine"))
            second = await call.read()
            await call.done_writing()
            return first, second
    first, second = asyncio.run(scenario())
    assert first.infer_response.id == "too-big" and "max_request_bytes" in first.error_message
    assert second.infer_response.id == "fine" and not second.error_message
    assert in_use(guarded) == 0


# The streams the guarded server takes at once (half its slots: its budget holds four messages).
STREAMS_AT_ONCE = MIN_SLOTS // 2


def test_streams_cancelled_while_answering_give_back_every_charge(guarded):
    """Streams cancelled by their clients 0-3 ms after sending three requests: an answer taken
    off the stream's queue just as the call was cancelled kept its lease for good (found by an
    independent soak: 0.25 MB a stream of a wide model, until requests were refused 503)."""
    rng = np.random.default_rng(5)
    pauses = iter(rng.random(400) * 0.003)

    sent = []

    async def one(channel):
        stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                       pb.ModelStreamInferResponse.FromString)
        call = stream()
        try:
            for rows in (1, 2, 3):
                await call.write(affine(rows))
            sent.append(call)
            await asyncio.sleep(next(pauses))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # refused for want of call slots (cancelled calls free theirs a moment later)
        call.cancel()

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            for _ in range(200):
                # as many streams at once as the server takes (the last round's gone first): on a
                # slow machine more of them overlapped and were refused, so fewer ran the race
                await wait_for(lambda: metric(guarded.url, "aclserve_grpc_streams") == 0)
                await asyncio.gather(*(one(channel) for _ in range(STREAMS_AT_ONCE)))
            await wait_for(lambda: in_use(guarded) == 0)
    ran_before = inferences(guarded)
    asyncio.run(scenario())
    assert in_use(guarded) == 0
    # the race was run: most streams got their three requests in, and the server ran requests
    assert len(sent) > 200, len(sent)
    assert inferences(guarded) > ran_before, "no streamed request reached the model"


def test_a_call_whose_message_does_not_come_is_ended(guarded):
    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(stalled_infer(channel), 30)  # a hang guard
            return e.value
    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "body_timeout_s" in error.details()


def test_a_stream_gone_quiet_is_ended_but_not_while_a_request_of_it_runs(guarded):
    """body_timeout_s is half a second: the first request of the stream waits in "slow"'s queue
    for longer (until a second stream's request fills its batch) and the stream is not ended;
    once it is answered and nothing more comes, it is, UNAVAILABLE: the server ended it and a
    new one may be opened (DEADLINE_EXCEEDED reads as the client's own deadline passed)."""
    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)
            call = stream()
            await call.write(affine(3, model="slow", request_id="waits"))
            await asyncio.sleep(1.5)  # three times the limit with the request queued
            filler = stream()
            await filler.write(affine(5, model="slow", request_id="fills"))  # 8 rows: the batch runs
            first, filled = await asyncio.wait_for(asyncio.gather(call.read(), filler.read()), 30)
            await filler.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(call.read(), 30)  # a hang guard: nothing more is sent
            return first, filled, e.value
    first, filled, error = asyncio.run(scenario())
    assert first.infer_response.id == "waits" and not first.error_message
    assert filled.infer_response.id == "fills"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert error.details().startswith("no request message on the stream for 0.5 s (body_timeout_s)")
    assert dict(error.trailing_metadata()).get("grpc-retry-pushback-ms") is None  # nothing to wait for
    assert in_use(guarded) == 0


# -- raw HTTP/2: half a message, silent and idle connections --------------------------------------

def raw_connection(srv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.config.grpc_port))


def test_a_call_that_stops_half_way_through_its_message_is_ended(guarded):
    with raw_connection(guarded) as sock:
        half = b"\x00" + struct.pack(">I", 1000) + b"\x00" * 400  # 400 of the 1,000 bytes announced
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + call_headers(INFER, guarded.grpc_url) + frame(DATA, 0, 1, half))
        frames = frames_until_closed(sock)  # the server ends the call, then the idle connection
    ended = [(kind, flags) for kind, flags, stream in frames if stream == 1]
    assert (HEADERS, 0x5) in ended or (HEADERS, 0x1) in ended or (RST_STREAM, 0) in ended, frames
    assert (GOAWAY, 0, 0) in frames


def test_silent_and_idle_connections_are_closed(guarded):
    with raw_connection(guarded) as silent, raw_connection(guarded) as idle:
        idle.sendall(PREFACE + frame(SETTINGS, 0, 0))  # says hello, then nothing
        assert (GOAWAY, 0, 0) in frames_until_closed(silent, answer=False)  # no hello within header_timeout_s
        assert (GOAWAY, 0, 0) in frames_until_closed(idle)  # no call within keepalive_timeout_s
    assert metric(guarded.url, "aclserve_request_memory_bytes") == 0


def test_connections_beyond_max_connections_are_closed_at_once(guarded):
    socks = []
    try:
        while len(socks) <= 5:  # connections that said hello and got the server's settings
            sock = raw_connection(guarded)
            socks.append(sock)
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
            sock.settimeout(30)
            if not sock.recv(9):  # closed without a word: over the cap
                break
        assert len(socks) <= 5  # max_connections is 4; a client of an earlier test may still count
    finally:
        for sock in socks:
            sock.close()
    async def served():
        # grpc core sees the closed connections leave a moment later: until then a new one is
        # still over the cap and closed at once (UNAVAILABLE); it must be served after that
        deadline = time.monotonic() + 10
        while True:
            try:
                async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
                    return await stubs(channel)[0](affine(1))
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    assert len(asyncio.run(served()).raw_output_contents) == 2


def test_a_failure_while_reading_a_message_ends_the_call_internal_without_its_text(guarded, monkeypatch):
    """Not a ServeError (none comes from reading today; a fault injected here stands for a
    future one): INTERNAL "internal error" as from the methods themselves, not grpc's UNKNOWN
    carrying the exception's text."""
    from aclserve.server import grpc_control

    async def failing(context, timeout_s):
        raise RuntimeError("private detail")
    monkeypatch.setattr(grpc_control, "receive", failing)

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            _, live = stubs(channel)  # one of the unary methods read by one_message
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(live(pb.ServerLiveRequest()), 30)  # a hang guard
            return e.value
    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.INTERNAL and error.details() == "internal error"
