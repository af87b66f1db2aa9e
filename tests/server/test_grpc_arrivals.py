"""gRPC messages received at once (server/grpc_arrivals.py): grpc keeps a message while it
arrives, before it can be charged, so at most max_inflight_bytes / grpc_max_message_bytes of
them arrive at once. Here that is 4: 4 MiB of budget, messages of at most 1 MiB."""
from __future__ import annotations

import asyncio
import logging
import queue
import shutil

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from aclserve.config import ConfigError, load_server_config
from aclserve.server import grpc_arrivals
from aclserve.server.grpc_arrivals import MIN_SLOTS, Arrival, Arrivals, NoRoomToReceive, StreamsFull
from tests.serving import free_port, server_config, started_with_grpc

from .hostile import metric, wait_for
from .grpc_raw import CHECK, INFER, OWN_CONNECTION, STREAM, affine
from .grpc_stubs import stalled_infer, stubs

MiB = 1 << 20


@pytest.fixture
def four_places(models_dir, tmp_path):
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    yield from started_with_grpc(server_config(
        tmp_path, grpc_port=free_port(), model_control_mode="none", max_body_bytes=4 * MiB,
        grpc_max_message_bytes=MiB, max_inflight_bytes=4 * MiB, max_request_bytes=2 * MiB, body_timeout_s=60))


def open_stream(channel):
    return channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                 pb.ModelStreamInferResponse.FromString)()


def test_a_slow_message_gives_way_to_calls_waiting_but_a_stream_keeps_its_place(four_places):
    """One stream and three calls whose message never comes hold the four places. A fifth call
    waits; after a second the oldest stalled call is ended (not the stream, older still), the
    fifth is answered, and the stream still serves."""
    url = four_places.grpc_url

    async def scenario():
        async with grpc.aio.insecure_channel(url) as channel:
            stream = open_stream(channel)
            await stream.write(affine(1, request_id="before"))
            before = await asyncio.wait_for(stream.read(), 30)
            stalled = [asyncio.ensure_future(stalled_infer(channel)) for _ in range(3)]
            await wait_for(lambda: metric(four_places.url, "aclserve_grpc_receiving") == 4)
            infer, _ = stubs(channel)
            answered = await asyncio.wait_for(infer(affine(2)), 30)  # a hang guard
            ended = await asyncio.wait(stalled, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            await stream.write(affine(1, request_id="after"))
            after = await asyncio.wait_for(stream.read(), 30)
            await stream.done_writing()
            for s in stalled:
                s.cancel()
            return before, answered, ended, after

    before, answered, (done, pending), after = asyncio.run(scenario())
    assert not before.error_message and not after.error_message and after.infer_response.id == "after"
    assert answered.outputs and len(done) == 1 and len(pending) == 2
    error = done.pop().exception()
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "other calls waited" in error.details() and "grpc_max_message_bytes" in error.details()
    assert metric(four_places.url, "aclserve_grpc_slow_messages_ended_total") == 1


def test_calls_one_connection_queues_keep_neither_probes_nor_other_connections_out(four_places):
    """A connection holds the four places with calls whose message never comes and queues 20 more.
    A health check on that same connection and a ModelInfer on another are answered with the
    places of the first four, ended after a second, ahead of the 20 (first come first served had
    them wait a round of a second for every four calls queued before them: 5,000 held every new
    call 45-60 s); the queued calls that wait 2 s are refused UNAVAILABLE, letting go of their call."""
    url = four_places.url

    async def scenario():
        async with grpc.aio.insecure_channel(four_places.grpc_url, options=OWN_CONNECTION) as hostile, \
                grpc.aio.insecure_channel(four_places.grpc_url, options=OWN_CONNECTION) as other:
            stalled = [asyncio.ensure_future(stalled_infer(hostile)) for _ in range(4)]
            await wait_for(lambda: metric(url, "aclserve_grpc_receiving") == 4)
            stalled += [asyncio.ensure_future(stalled_infer(hostile)) for _ in range(20)]
            await wait_for(lambda: metric(url, "aclserve_grpc_waiting") == 20)

            async def answered_while(call):
                answer = await asyncio.wait_for(call, 30)  # a hang guard
                return answer, sum(s.done() for s in stalled)  # the hostile calls ended before it
            check = hostile.unary_unary(CHECK, None, None)(b"")
            infer, _ = stubs(other)
            probe, inferred = await asyncio.gather(answered_while(check), answered_while(infer(affine(2))))
            await wait_for(lambda: metric(url, "aclserve_grpc_waiting") == 0)  # each refused or in a place

            def ended_by_server() -> float:
                return (metric(url, "aclserve_grpc_slow_messages_ended_total")
                        + metric(url, "aclserve_grpc_calls_refused_total", 'reason="no_room_to_receive"'))
            await wait_for(lambda: sum(s.done() for s in stalled) >= ended_by_server())
            for s in stalled:  # (those in a place once none waits are ended by body_timeout_s only)
                s.cancel()
            return probe, inferred, [s.exception() for s in stalled if s.done() and not s.cancelled()]

    (health, ended_before_probe), (answer, ended_before_answer), errors = asyncio.run(scenario())
    assert health == b"\x08\x01"  # SERVING
    assert answer.outputs
    assert ended_before_probe <= 4 and ended_before_answer <= 4, (ended_before_probe, ended_before_answer)
    codes = [e.code() for e in errors]
    assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}, codes
    refused = [e for e in errors if e.code() == grpc.StatusCode.UNAVAILABLE]
    assert refused and refused[0].details().startswith(
        "no room to receive the request message: it waited 2 s while other calls' messages held every place "
        "(at most 4 messages are received at once: max_inflight_bytes / grpc_max_message_bytes)")
    assert dict(refused[0].trailing_metadata() or ()).get("grpc-retry-pushback-ms")
    assert metric(url, "aclserve_grpc_calls_refused_total", 'reason="no_room_to_receive"') == len(refused)
    assert metric(url, "aclserve_grpc_waiting") == 0


def test_streams_hold_at_most_half_of_the_places(four_places, caplog):
    """A stream past the cap is answered on the stream (its request's error_message, which
    Triton's C++ client reads where it drops the stream's status), then ends UNAVAILABLE."""
    url = four_places.grpc_url
    caplog.set_level(logging.WARNING, logger="aclserve.server.grpc_arrivals")

    async def scenario():
        async with grpc.aio.insecure_channel(url) as channel:
            streams = [open_stream(channel) for _ in range(2)]
            for i, s in enumerate(streams):
                await s.write(affine(1, request_id=str(i)))
                await asyncio.wait_for(s.read(), 30)
            open_now = metric(four_places.url, "aclserve_grpc_streams")
            third = open_stream(channel)
            await third.write(affine(1, request_id="third"))
            said = await asyncio.wait_for(third.read(), 30)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(third.read(), 30)
            await streams[0].done_writing()
            await wait_for(lambda: metric(four_places.url, "aclserve_grpc_streams") == 1)
            fourth = open_stream(channel)
            await fourth.write(affine(1, request_id="fourth"))
            answer = await asyncio.wait_for(fourth.read(), 30)
            for s in (streams[1], fourth):
                await s.done_writing()
            return open_now, said, refused.value, answer

    open_now, said, refused, answer = asyncio.run(scenario())
    assert open_now == 2
    assert said.infer_response.id == "third" and said.error_message == refused.details()
    assert refused.code() == grpc.StatusCode.UNAVAILABLE and "2 gRPC streams open" in refused.details()
    assert "raise max_inflight_bytes or lower grpc_max_message_bytes" in refused.details()
    assert dict(refused.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
    assert answer.infer_response.id == "fourth"
    assert metric(four_places.url, "aclserve_grpc_streams_refused_total") == 1
    said = [r.getMessage() for r in caplog.records if r.name == "aclserve.server.grpc_arrivals"]
    assert len(said) == 1 and "refused 1 stream(s): 2 streams were open" in said[0], said
    assert "grpc_max_message_bytes" in said[0]


def test_a_refused_stream_fails_a_tritonclient_request_as_an_answer_says(four_places):
    """tritonclient's stream callback gets the refusal first as its request's answer (no status,
    as Triton's C++ client, which perf_analyzer runs, reads it: a refusal by status alone left
    perf_analyzer waiting forever), then as the status that ends the stream. A client that
    opted into triton_grpc_error gets the status alone."""
    clients = [grpcclient.InferenceServerClient(four_places.grpc_url) for _ in range(4)]
    x = grpcclient.InferInput("x", [1, 8], "FP32")
    x.set_data_from_numpy(np.ones((1, 8), np.float32))
    idx = grpcclient.InferInput("idx", [1, 3], "INT64")
    idx.set_data_from_numpy(np.ones((1, 3), np.int64))
    answers = [queue.Queue() for _ in clients]
    try:
        for i, (client, got) in enumerate(zip(clients, answers)):
            headers = {"triton_grpc_error": "true"} if i == 3 else None
            client.start_stream(callback=lambda result, error, got=got: got.put(error), headers=headers)
            if i < 3:  # (the opted-in stream ends at its open: tritonclient refuses to send on it then)
                client.async_stream_infer("affine", [x, idx], request_id=str(i))
            if i < 2:
                assert got.get(timeout=30) is None  # the two streams allowed
        refused = [answers[2].get(timeout=30), answers[2].get(timeout=30)]
        opted_in = answers[3].get(timeout=30)
    finally:
        for client in clients:
            client.stop_stream()
            client.close()
    assert refused[0].status() is None and "2 gRPC streams open" in refused[0].message()
    assert "raise max_inflight_bytes" in refused[0].message()
    assert refused[1].status() == "StatusCode.UNAVAILABLE" and refused[1].message() == refused[0].message()
    assert opted_in.status() == "StatusCode.UNAVAILABLE" and answers[3].empty()


def test_refused_streams_are_all_said_in_the_log(caplog):
    """The first refusal is said at once, those after it within REFUSAL_LOG_S when that time is
    up or at close(): a line said "1 refused so far" of a burst of 8, and nothing more."""
    caplog.set_level(logging.WARNING, logger="aclserve.server.grpc_arrivals")

    async def burst():
        arrivals = Arrivals(MIN_SLOTS)
        for _ in range(arrivals.stream_slots):
            arrivals.open_stream()
        for _ in range(8):
            with pytest.raises(StreamsFull):
                arrivals.open_stream()
        arrivals.close()
        arrivals.close()  # idempotent
        return arrivals

    arrivals = asyncio.run(burst())
    said = [r.getMessage() for r in caplog.records if r.name == "aclserve.server.grpc_arrivals"]
    assert len(said) == 2 and arrivals.streams_refused == 8, said
    assert "refused 1 stream(s): " in said[0] and "; 1 refused in all" in said[0]
    assert "refused 7 stream(s) in the last 0 s: " in said[1] and "; 8 refused in all" in said[1]


def test_a_message_over_grpc_max_message_bytes_is_refused_by_grpc(four_places):
    async def scenario():
        async with grpc.aio.insecure_channel(four_places.grpc_url) as channel:
            call = channel.unary_unary(INFER, None, pb.ModelInferResponse.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(call(b"\0" * (MiB + 1)), 30)
            return e.value
    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("values, said", [
    # lowered to max_body_bytes without a word, though the default's comment says to raise it
    (dict(max_body_bytes=4 * MiB, grpc_max_message_bytes=16 * MiB),
     "grpc_max_message_bytes: must be <= max_body_bytes (4194304): raise that too or lower this, got 16777216"),
    # four messages arriving at once, before they can be charged, held 16 MiB of a 4 MiB budget
    (dict(max_body_bytes=4 * MiB, grpc_max_message_bytes=4 * MiB, max_inflight_bytes=4 * MiB, max_request_bytes=MiB),
     "grpc_max_message_bytes: must be <= max_inflight_bytes / 4 (1048576): 4 gRPC messages may be arriving at once"),
])
def test_a_message_size_past_the_body_limit_or_the_budget_is_refused(tmp_path, values, said):
    with pytest.raises(ConfigError) as info:
        server_config(tmp_path, grpc_port=free_port(), **values)
    assert str(info.value).startswith(said), str(info.value)
    assert server_config(tmp_path, grpc_port=0, **values).grpc_max_message_bytes == values["grpc_max_message_bytes"]


@pytest.mark.parametrize("values, fitted", [
    (dict(max_body_bytes=MiB), MiB),  # a common hardening: it refused to start for the default's 8 MiB
    (dict(max_inflight_bytes=16 * MiB, max_request_bytes=MiB), 4 * MiB),
    (dict(max_body_bytes=64 * MiB), 8 * MiB),
])
def test_the_default_message_size_is_lowered_to_fit_the_body_limit_and_the_budget(tmp_path, values, fitted):
    """Only a grpc_max_message_bytes set is refused: the default is lowered to fit what was set lower
    (a reviewer: a config setting max_body_bytes: 1048576 alone no longer started)."""
    config = load_server_config(None, {"models_dir": str(tmp_path), "grpc_port": free_port(), **values})
    assert config.grpc_max_message_bytes == fitted


@pytest.mark.parametrize("budget", [4 * MiB, 5 * MiB - 1, 16 * MiB, 512 * MiB])
@pytest.mark.parametrize("message", [MiB, 2 * MiB, 4 * MiB, 64 * MiB])
def test_the_messages_arriving_at_once_fit_the_budget_or_the_config_is_refused(tmp_path, budget, message):
    """MIN_SLOTS (two streams, two calls) kept four places however small the budget: 4 MiB
    messages on a 4 MiB budget could hold 16 MiB arriving (an independent tester's reading)."""
    try:
        config = server_config(tmp_path, grpc_port=free_port(), max_body_bytes=64 * MiB, max_inflight_bytes=budget,
                               max_request_bytes=MiB, grpc_max_message_bytes=message)
    except ConfigError as e:
        assert e.path == "grpc_max_message_bytes" and message > budget // MIN_SLOTS, e
        return
    arrivals = Arrivals.for_config(config)
    assert arrivals.slots >= MIN_SLOTS and arrivals.slots * message <= budget


async def held_full() -> tuple[Arrivals, list[Arrival]]:
    """Arrivals whose every place is held (by connection "h")."""
    arrivals = Arrivals(MIN_SLOTS)
    holders = [Arrival(source="h") for _ in range(arrivals.slots)]
    for holder in holders:
        await arrivals.admit(holder)
    return arrivals, holders


def test_a_read_cancelled_as_a_place_is_given_back_leaves_its_line_once():
    """The place given back passes over the read whose call was just cancelled (its task not run
    since); that read then found itself gone from the line: ValueError out of the cancellation,
    logged "internal error in gRPC ModelInfer" with a traceback, 800 lines of a burst of resets."""
    async def scenario():
        arrivals, holders = await held_full()
        cancelled = asyncio.ensure_future(arrivals.admit(Arrival(source="c")))
        await asyncio.sleep(0)  # it waits in its line
        cancelled.cancel()
        arrivals.leave(holders[0])  # (before the cancelled task runs again)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        following = Arrival(source="c")
        await arrivals.admit(following)  # the place given back is free: taken at once
        return arrivals

    arrivals = asyncio.run(scenario())
    assert arrivals.holding == arrivals.slots and arrivals.waiting == 0


def test_probes_go_first_then_one_read_of_each_connection_in_turn():
    async def scenario():
        arrivals, holders = await held_full()
        order = []

        async def read(name: str, source: str, probe: bool = False):
            arrival = Arrival(probe=probe, source=source)
            await arrivals.admit(arrival)
            order.append(name)
            arrivals.leave(arrival)
        queued = []
        for name, source, probe in [("a1", "a", False), ("a2", "a", False), ("a3", "a", False),
                                    ("b1", "b", False), ("live", "a", True), ("b2", "b", False)]:
            queued.append(asyncio.ensure_future(read(name, source, probe)))
            await asyncio.sleep(0)
        assert arrivals.waiting == 6
        arrivals.leave(holders[0])  # one place, passed on by each read as it leaves
        await asyncio.gather(*queued)
        return order

    assert asyncio.run(scenario()) == ["live", "a1", "b1", "a2", "b2", "a3"]


def test_a_read_that_waits_too_long_is_refused_and_holds_nothing(monkeypatch):
    monkeypatch.setattr(grpc_arrivals, "WAIT_LIMIT_S", 0.01)

    async def scenario():
        arrivals, holders = await held_full()
        with pytest.raises(NoRoomToReceive) as refused:
            await arrivals.admit(Arrival(source="w"))
        waiting_after = arrivals.waiting
        arrivals.leave(holders[0])
        after = Arrival(source="w")
        await arrivals.admit(after)  # the place given back went to no one: free
        return arrivals, refused.value, waiting_after

    arrivals, refused, waiting_after = asyncio.run(scenario())
    assert arrivals.waits_refused == 1 and waiting_after == 0 and arrivals.holding == arrivals.slots
    assert refused.message.startswith("no room to receive the request message: it waited 0.01 s")
    assert "at most 4 messages are received at once" in refused.message
