"""gRPC calls that end by no doing of their own. Shutdown while a batch hangs: every call still
open at the shutdown deadline ends with UNAVAILABLE saying the server is shutting down and the
retry pushback (HTTP's 503 with Retry-After), whichever handler's path it ends in, and a call
done before the deadline gets its answer. A client that goes away with its answer not taken
costs the log one debug line, while a batch that fails still logs its error. Executions are
held by the CPU runtime's fault injection and released by the test; the only time limits are
hang guards."""
from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import threading

import aiohttp
import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.acl.cpu import faults

from tests.hung_device import let_go
from tests.serving import ServerThread, free_port, started_with_grpc

from .hostile import wait_for
from .grpc_raw import DATA, INFER, LIVE, PREFACE, STREAM, affine, call_headers, frame
from .grpc_stubs import stalled_infer, stubs
from .test_grpc_guards import in_use
from .test_grpc_slow_clients import grpc_message, rows_run, zero_window_settings

HANG_GUARD_S = 60
READY = "/inference.GRPCInferenceService/ServerReady"
MODEL_READY = "/inference.GRPCInferenceService/ModelReady"
PUSHBACK = ("grpc-retry-pushback-ms", "1000")


@pytest.fixture
def held_models(models_dir, tmp_path):
    """affine and a copy of it ("other"), whose executions only the test (or the shutdown) ends.
    Nor may a queue deadline end a request waiting behind a held batch: with one slot (`slots:
    auto` on one core) it waits in the queue, whose auto deadline (2 s) came before the shutdown's."""
    for name in ("affine", "other"):
        shutil.copy(models_dir / "affine.om", tmp_path / f"{name}.om")
        (tmp_path / f"{name}.yaml").write_text(
            "execution_timeout_ms: 600000\nbatching: {default_queue_policy: {default_timeout_ms: 600000}}\n")
    return tmp_path


@pytest.fixture
def grpc_server(held_models, make_config, clean_faults):
    config = make_config(held_models, grpc_port=free_port(), model_control_mode="none", shutdown_timeout_s=3,
                         body_timeout_s=600)
    yield from started_with_grpc(config)


def held_server(held_models, make_config, shutdown_timeout_s: float) -> ServerThread:
    """A started server of `held_models` whose `grpc_url` is its gRPC address (the caller closes it)."""
    config = make_config(held_models, grpc_port=free_port(), model_control_mode="none",
                         shutdown_timeout_s=shutdown_timeout_s, body_timeout_s=600)
    server = ServerThread(config).start()
    server.grpc_url = f"127.0.0.1:{config.grpc_port}"
    return server


async def entered(fault) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, fault.entered.wait, HANG_GUARD_S)


async def outcome(call):
    """The call's answer, or the AioRpcError it ended with."""
    try:
        return await asyncio.wait_for(call, HANG_GUARD_S)
    except grpc.aio.AioRpcError as e:
        return e


async def stream_outcome(call) -> tuple[list[str], grpc.aio.AioRpcError | None]:
    """The error messages of a stream's answers, and the error the stream ended with."""
    answers = []
    try:
        while (answer := await asyncio.wait_for(call.read(), HANG_GUARD_S)) is not grpc.aio.EOF:
            answers.append(answer.error_message)
    except grpc.aio.AioRpcError as e:
        return answers, e
    return answers, None


def infer_and_ready(channel):
    """`channel`'s ModelInfer and ServerReady calls (drain_begun asks ServerReady)."""
    ready = channel.unary_unary(READY, pb.ServerReadyRequest.SerializeToString, pb.ServerReadyResponse.FromString)
    return stubs(channel)[0], ready


async def drain_begun(ready) -> None:
    """Until the drain has begun: ServerReady on the channel answers false, or fails UNAVAILABLE
    (its connection told to go and the port closed, as the drain begins) or CANCELLED (a call
    still on its way as grpc's own stop began, which grpc core cancels: seen once in a
    fresh-clone CI run, when that stop also cancelled the calls grpc had queued)."""
    while True:
        try:
            if not (await asyncio.wait_for(ready(pb.ServerReadyRequest()), HANG_GUARD_S)).ready:
                return
        except grpc.aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                return
            raise
        await asyncio.sleep(0.01)


def assert_shutting_down(error) -> None:
    assert isinstance(error, grpc.aio.AioRpcError), error
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in error.details(), error
    assert PUSHBACK in tuple(error.trailing_metadata() or ()), error


def test_calls_open_at_the_shutdown_deadline_are_unavailable_and_one_done_before_is_answered(grpc_server):
    """"affine"'s batch hangs past the deadline: a ModelInfer in it, a stream with a request
    queued behind it and a ModelInfer whose message never comes are still open then; "other"'s
    batch is let go during the drain."""
    hung, finishing = threading.Event(), threading.Event()

    async def scenario():
        async with grpc.aio.insecure_channel(grpc_server.grpc_url) as channel:
            infer, ready = infer_and_ready(channel)
            silent = stalled_infer(channel)
            first = faults.inject("execute", nth=1, hold=hung)
            stuck = asyncio.ensure_future(outcome(infer(affine(1))))
            await entered(first)
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)()
            await stream.write(affine(1, request_id="queued"))
            second = faults.inject("execute", nth=1, hold=finishing)
            done = asyncio.ensure_future(outcome(infer(affine(2, model="other"))))
            await entered(second)
            closing = asyncio.get_running_loop().run_in_executor(None, grpc_server.close)
            await drain_begun(ready)
            finishing.set()
            answered = await done
            results = await stuck, await outcome(silent), await stream_outcome(stream)
            await closing
            return answered, results
    try:
        answered, (stuck, silent, (stream_answers, stream_end)) = asyncio.run(scenario())
    finally:
        finishing.set()
        let_go(hung)
    assert np.frombuffer(answered.raw_output_contents[1], np.int64).shape == (6,)
    assert_shutting_down(stuck)
    assert_shutting_down(silent)
    assert stream_answers == ["model version affine:1 is shutting down (unloaded, replaced, or the server is stopping)"]
    assert_shutting_down(stream_end)


def test_every_call_ended_at_shutdown_carries_the_pushback(held_models, make_config):
    """The same refusal whichever handler's path it is raised in: a ModelReady whose message
    never comes (read by one_message), a ModelInfer whose message never comes and a stream
    without requests, all open when the drain ends."""
    config = make_config(held_models, grpc_port=free_port(), model_control_mode="none", shutdown_timeout_s=0.5,
                         body_timeout_s=600)
    server = ServerThread(config).start()
    server.grpc_url = f"127.0.0.1:{config.grpc_port}"

    async def scenario():
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            silent_ready = stalled_infer(channel, MODEL_READY)
            silent_infer = stalled_infer(channel)
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)()
            await stream.write(affine(1, request_id="answered"))
            assert (await asyncio.wait_for(stream.read(), HANG_GUARD_S)).error_message == ""  # the stream is in
            await asyncio.get_running_loop().run_in_executor(None, server.close)
            return await outcome(silent_ready), await outcome(silent_infer), await stream_outcome(stream)
    try:
        ready, infer, (stream_answers, stream_end) = asyncio.run(scenario())
    finally:
        server.close()
    assert server.error is None
    assert_shutting_down(ready)
    assert_shutting_down(infer)
    assert stream_answers == [] and stream_end is not None
    assert_shutting_down(stream_end)


def test_a_client_gone_before_taking_its_answer_costs_one_debug_line(grpc_server, caplog):
    """A ModelInfer and a stream whose clients open no flow-control window, so their answers
    wait on them, then go: one DEBUG line each, no ERROR with a traceback (grpc's own
    "ExecuteBatchError raised in core" before). A batch that fails on the device still logs
    its ERROR."""
    caplog.set_level(logging.DEBUG)
    # `aclserve serve` keeps it at WARNING (a test before may have run it)
    caplog.set_level(logging.DEBUG, logger="grpc")
    for method, end_stream in ((INFER, 0x1), (STREAM, 0)):
        answered = rows_run(grpc_server, "affine") + 2
        with socket.create_connection(("127.0.0.1", grpc_server.config.grpc_port)) as sock:
            sock.sendall(PREFACE + zero_window_settings() + call_headers(method, grpc_server.grpc_url)
                         + frame(DATA, end_stream, 1, grpc_message(affine(2))))
            asyncio.run(wait_for(lambda: rows_run(grpc_server, "affine") >= answered))
        asyncio.run(wait_for(lambda: in_use(grpc_server) == 0))  # the call has ended
    # (records' formats only: formatting some of grpc's DEBUG records later can crash the process)
    grpc_lines = [r for r in caplog.records if r.name.startswith("grpc") and r.levelno > logging.DEBUG]
    assert grpc_lines == [], [r.msg for r in grpc_lines]
    gone = [r for r in caplog.records if "client went away" in str(r.msg)]
    # a stream whose client goes before its answer reached the write is cancelled by grpc
    # instead (its own DEBUG line), or, when the stream sees the cancellation before it hands
    # grpc the answer, ends without a word (grpc_stream.py drops it); which of the three
    # depends on the timing on a loaded machine: at most one DEBUG line, never an ERROR
    cancelled = [r for r in caplog.records
                 if r.levelno == logging.DEBUG and f"servicer method [{STREAM}]" in str(r.msg)]
    assert [(r.levelno, r.args, r.exc_info) for r in gone if r.args != (STREAM,)] == [(logging.DEBUG, (INFER,), None)]
    assert len([r for r in gone if r.args == (STREAM,) and r.levelno == logging.DEBUG]) + len(cancelled) <= 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and STREAM in str(r.msg) + str(r.args)]

    faults.inject("execute", count=2)  # the run and its re-run (retry)

    async def failing():
        async with grpc.aio.insecure_channel(grpc_server.grpc_url) as channel:
            return await outcome(stubs(channel)[0](affine(1)))
    error = asyncio.run(failing())
    assert error.code() == grpc.StatusCode.INTERNAL and "failed" in error.details(), error
    assert any(r.levelno == logging.ERROR and "failed on device" in r.getMessage() for r in caplog.records)


def test_a_stream_waiting_for_its_next_request_ends_when_the_drain_begins(held_models, make_config, clean_faults):
    """A stream answered and then idle does not hold the shutdown: it ends UNAVAILABLE while the
    drain still waits for a ModelInfer whose batch is held (before, it stayed open until the
    deadline, here 600 s away); the held call is answered once let go."""
    server = held_server(held_models, make_config, shutdown_timeout_s=600)
    hung = threading.Event()

    async def scenario():
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            infer, ready = infer_and_ready(channel)
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)()
            await stream.write(affine(1, request_id="answered"))
            assert (await asyncio.wait_for(stream.read(), HANG_GUARD_S)).error_message == ""
            held = faults.inject("execute", nth=1, hold=hung)
            stuck = asyncio.ensure_future(outcome(infer(affine(1))))
            await entered(held)
            closing = asyncio.get_running_loop().run_in_executor(None, server.close)
            await drain_begun(ready)
            stream_answers, stream_end = await stream_outcome(stream)
            held_then = not stuck.done()
            let_go(hung)
            answered = await stuck
            await closing
            return stream_answers, stream_end, held_then, answered
    try:
        stream_answers, stream_end, held_then, answered = asyncio.run(scenario())
    finally:
        let_go(hung)
        server.close()
    assert server.error is None
    assert stream_answers == [] and held_then
    assert_shutting_down(stream_end)
    assert not isinstance(answered, grpc.aio.AioRpcError), answered


async def http_refuses(server) -> None:
    """Until a new HTTP connection is answered 503: the drain has begun (shutting down is set)."""
    async def refused():
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(f"http://{server.url}/v2/health/live") as answer:
                    if answer.status == 503:
                        return
                await asyncio.sleep(0.01)
    await asyncio.wait_for(refused(), HANG_GUARD_S)


def test_a_connection_is_told_to_go_when_the_drain_begins_and_its_call_in_flight_is_answered(
        held_models, make_config, clean_faults):
    """A persistent client (one channel, tritonclient's way) has its connection asked to go
    (GOAWAY) as the drain begins, while a call of it is still held, and the port closes: its
    next call fails at once and a balancer's next connection goes to another replica. Before,
    every call on that connection was answered "shutting down" for the whole drain and the
    connection went only when the endpoint stopped, after the held call had been ended at the
    deadline. The held call is answered once let go."""
    server = held_server(held_models, make_config, shutdown_timeout_s=5)
    hung = threading.Event()

    async def scenario():
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            infer, live = stubs(channel)
            assert (await live(pb.ServerLiveRequest())).live
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            held = faults.inject("execute", nth=1, hold=hung)
            stuck = asyncio.ensure_future(outcome(infer(affine(1))))
            await entered(held)
            closing = asyncio.get_running_loop().run_in_executor(None, server.close)
            await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), HANG_GUARD_S)
            held_then = not stuck.done()
            next_call = await outcome(live(pb.ServerLiveRequest()))
            let_go(hung)
            answered = await stuck
            await closing
            return held_then, next_call, answered
    try:
        held_then, next_call, answered = asyncio.run(scenario())
    finally:
        let_go(hung)
        server.close()
    assert server.error is None
    assert held_then, "the connection went only once the held call had ended"
    assert isinstance(next_call, grpc.aio.AioRpcError) and next_call.code() == grpc.StatusCode.UNAVAILABLE, next_call
    assert "shutting down" not in next_call.details(), next_call  # refused by the channel, not by this server
    assert not isinstance(answered, grpc.aio.AioRpcError), answered
    assert np.frombuffer(answered.raw_output_contents[1], np.int64).shape == (3,)


def test_server_live_answers_false_once_the_drain_has_begun(held_models, make_config, clean_faults):
    """As /v2/health/live answers 503 then, and Triton's IsLive is false once it exits: a
    ServerLive call open when the drain begins, its message sent after, answers live false
    (true before: the drain's only other difference from HTTP)."""
    server = held_server(held_models, make_config, shutdown_timeout_s=600)

    async def scenario():
        send = asyncio.Event()

        async def message():
            await send.wait()
            yield pb.ServerLiveRequest()
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            _, live = stubs(channel)
            late = channel.stream_unary(LIVE, pb.ServerLiveRequest.SerializeToString,
                                        pb.ServerLiveResponse.FromString)(message())
            before = (await live(pb.ServerLiveRequest())).live  # (after the late call's headers, on one connection)
            closing = asyncio.get_running_loop().run_in_executor(None, server.close)
            await http_refuses(server)
            send.set()
            during = await outcome(late)
            await closing
            return before, during
    try:
        before, during = asyncio.run(scenario())
    finally:
        server.close()
    assert server.error is None
    assert before is True
    assert not isinstance(during, grpc.aio.AioRpcError), during
    assert during.live is False
