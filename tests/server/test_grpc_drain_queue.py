"""gRPC calls grpc has received but not handed to a handler when the drain begins. grpc core keeps
them until grpc.aio's accept loop, on the server's event loop, asks for them; grpc's own stop
ends those still kept CANCELLED (grpc/grpc#41785), which clients' retry policies keyed on
UNAVAILABLE do not retry. Under a steady load most calls in flight wait there: SIGTERM during 48
ModelInfer calls kept in flight on 6 channels ended up to 47 of them CANCELLED.

The timing is made, not waited for: the server's loop is held (a callback waiting on the test),
so the accept loop takes nothing while the calls arrive in grpc core (its channelz count says
they are in), and the shutdown is asked for behind that callback; the drain then begins before
the accept loop can take more than a call or two. A call in flight before, its batch held by
the CPU runtime's fault injection, is answered once let go. The calls the drain takes then are
refused after the GOAWAY on their connection, so that their clients send the next call elsewhere
(read frame by frame from a client of raw HTTP/2: grpc_raw.py)."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import threading

import grpc
import numpy as np
import pytest
from grpc._cython import cygrpc
from tritonclient.grpc import service_pb2 as pb

from aclserve.acl.cpu import faults
from aclserve.server.grpc_queued import calls_received, server_ids

from tests.hung_device import let_go
from tests.serving import free_port, started_with_grpc

from .grpc_raw import DATA, GOAWAY, HEADERS, INFER, PREFACE, SETTINGS, affine, call_headers, frame, frames_until_closed
from .hostile import wait_for
from .test_grpc_shutdown import HANG_GUARD_S, assert_shutting_down, entered, infer_and_ready, outcome
from .test_grpc_slow_clients import grpc_message

QUEUED = 6


@pytest.fixture
def server(models_dir, tmp_path, make_config, clean_faults):
    """affine, whose batch the test holds: no queue deadline nor execution timeout ends it first."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(
        "execution_timeout_ms: 600000\nbatching: {default_queue_policy: {default_timeout_ms: 600000}}\n")
    config = make_config(tmp_path, grpc_port=free_port(), model_control_mode="none", shutdown_timeout_s=600,
                         body_timeout_s=600)
    yield from started_with_grpc(config)


@contextlib.contextmanager
def loop_held(server):
    """The server's event loop held by a callback that waits for the block's end: grpc.aio's accept
    loop takes no call meanwhile, while grpc core receives them on its own threads."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        release.wait(HANG_GUARD_S)
    server.on_loop(hold)
    try:
        assert holding.wait(HANG_GUARD_S)
        yield
    finally:
        release.set()


def test_calls_grpc_holds_as_the_drain_begins_end_unavailable_not_cancelled(server):
    hung = threading.Event()

    async def scenario():
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            infer, ready = infer_and_ready(channel)
            assert (await asyncio.wait_for(ready(pb.ServerReadyRequest()), HANG_GUARD_S)).ready
            core = max(server_ids())  # (the server made last)
            held = faults.inject("execute", nth=1, hold=hung)
            in_flight = asyncio.ensure_future(outcome(infer(affine(1))))
            await entered(held)
            with loop_held(server):
                received = calls_received(core)
                queued = [asyncio.ensure_future(outcome(infer(affine(1)))) for _ in range(QUEUED)]
                await wait_for(lambda: calls_received(core) == received + QUEUED, HANG_GUARD_S)
                server.begin_close()  # run once the loop is let go
            ended = await asyncio.gather(*queued)
            let_go(hung)
            return ended, await in_flight
    try:
        ended, answered = asyncio.run(scenario())
    finally:
        let_go(hung)
    codes = [e.code() if isinstance(e, grpc.aio.AioRpcError) else "OK" for e in ended]
    assert grpc.StatusCode.CANCELLED not in codes, codes
    for error in ended:
        assert_shutting_down(error)
    assert np.frombuffer(answered.raw_output_contents[1], np.int64).shape == (3,)


def test_the_calls_the_drain_takes_are_refused_after_the_goaway(server):
    """Refused at once (before grpc's own stop), a call's client sent its next one on the same
    connection, which that stop then cancelled. Each call's status is its trailers (a HEADERS
    frame ending its stream), grpc-message a literal (grpc core sends it as it is)."""
    streams = range(1, 2 * QUEUED, 2)
    core = max(server_ids())
    with socket.create_connection(("127.0.0.1", server.config.grpc_port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        with loop_held(server):
            received = calls_received(core)
            sock.sendall(b"".join(call_headers(INFER, server.grpc_url, stream)
                                  + frame(DATA, 0x1, stream, grpc_message(affine(1))) for stream in streams))
            asyncio.run(wait_for(lambda: calls_received(core) == received + QUEUED, HANG_GUARD_S))
            server.begin_close()
        found = frames_until_closed(sock, limit_s=HANG_GUARD_S, payloads=True)
    goaway = next(i for i, (kind, *_) in enumerate(found) if kind == GOAWAY)
    ends = {stream: (i, payload) for i, (kind, flags, stream, payload) in enumerate(found)
            if kind == HEADERS and flags & 0x1}
    assert sorted(ends) == list(streams), found
    assert all(i > goaway and b"server is shutting down" in payload for i, payload in ends.values()), found


def test_a_call_grpc_refused_itself_is_not_said_to_end_cancelled(server, caplog):
    """A HEADERS frame without :path is counted by grpc core as received and never handed to the
    server, so the drain waits out QUEUE_WAIT_S for it; its line said grpc's stop ends such calls
    CANCELLED, false for this one: it now says the count may include calls grpc refused itself."""
    core = max(server_ids())
    block = b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":authority", server.grpc_url.encode()),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    with socket.create_connection(("127.0.0.1", server.config.grpc_port), timeout=HANG_GUARD_S) as sock:
        received = calls_received(core)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 1, block))
        asyncio.run(wait_for(lambda: calls_received(core) == received + 1, HANG_GUARD_S))
        with caplog.at_level("INFO", logger="aclserve.server.grpc_server"):
            server.close()
    said = [r for r in caplog.records if "were not handed to the server" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO", caplog.messages
    assert "may include calls grpc refused itself" in said[0].getMessage(), said[0].getMessage()
    assert "ends them CANCELLED" not in said[0].getMessage()


@pytest.mark.parametrize("answer", ['{"servers": []}', '{"server": []}', '{"server": {"data": {"callsStarted": null}}}',
                                    '{"server": {"data": {"callsStarted": "many"}}}'])
def test_a_channelz_read_of_another_shape_is_no_view(monkeypatch, answer):
    """A grpcio whose channelz JSON differs raised KeyError, AttributeError or TypeError out of the
    drain (after grpc's stop was asked for, so the wait for the live calls was skipped), as did a count
    that is not a number (ValueError, outside the try): now no view,
    as a server gone (the drain does not wait for grpc's queue)."""
    monkeypatch.setattr(cygrpc, "channelz_get_server", lambda channelz_id: answer)
    assert calls_received(1) is None
