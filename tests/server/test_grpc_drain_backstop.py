"""The drain's backstop (GrpcServer, STOP_BACKSTOP_S): a call still open when the drain's deadline
has passed is ended STOP_BACKSTOP_S later even when stop() is not called (serve() calls it once the
HTTP answers are out, which a stalled client can hold up). The endpoint runs on the test's loop,
as test_grpc_stop_without_drain's does; the call is a ModelInfer whose message never comes."""
from __future__ import annotations

import asyncio
import time

import grpc

from aclserve.server import grpc_server as grpc_server_module
from aclserve.server.grpc_server import GrpcServer

from tests.serving import server_config, started_app
from .hostile import wait_for
from .grpc_stubs import stalled_infer
from .test_grpc_shutdown import outcome

BACKSTOP_S = 0.5  # the module's 10 s, made short


def test_the_backstop_ends_a_call_still_open_after_the_drain_without_a_stop(tmp_path, monkeypatch):
    """The drain returns at its deadline (now) with the call open and its handler reading; nothing
    stops the endpoint after it, and the call ends all the same: grpc's stop cancels every call. Without
    the backstop it stayed open until its client went (here: the outcome's hang guard)."""
    monkeypatch.setattr(grpc_server_module, "STOP_BACKSTOP_S", BACKSTOP_S)

    async def scenario():
        config = server_config(tmp_path, body_timeout_s=600)  # (no end of the call's own before the backstop's)
        runner, state, *_ = await started_app(config)
        server = GrpcServer(state, config.max_body_bytes)
        try:
            port = await server.start("127.0.0.1", 0)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                silent = stalled_infer(channel)
                await wait_for(lambda: state.grpc_arrivals.holding == 1)  # its handler waits for the message
                await server.drain(time.monotonic())
                open_after_drain = not silent.done()
                return open_after_drain, await outcome(silent)
        finally:
            await server.stop()
            await runner.cleanup()
    open_after_drain, ended = asyncio.run(scenario())
    assert open_after_drain
    # grpc's stop(None): "Cancelling all calls", not this server's "shutting down" of stop()
    assert isinstance(ended, grpc.aio.AioRpcError) and ended.code() == grpc.StatusCode.UNAVAILABLE, ended
    assert "shutting down" not in ended.details(), ended
