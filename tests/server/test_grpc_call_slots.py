"""gRPC's call slots (max_connections calls at once, grpc.aio's own limit): calls stalled before
their message hold them, the next call is refused RESOURCE_EXHAUSTED and counted, calls are served
again once a slot is free, and shutdown does not wait for a stalled call. A real server on a real
port, driven by grpc.aio channels."""
from __future__ import annotations

import asyncio
import shutil

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.serving import ServerThread, free_port, server_config

from .grpc_stubs import stalled_infer, stubs
from .hostile import metric, wait_for


def small_server(models_dir, root, **overrides) -> ServerThread:
    shutil.copy(models_dir / "double.om", root / "double.om")
    return ServerThread(server_config(root, grpc_port=free_port(), model_control_mode="none",
                                      body_timeout_s=600, **overrides)).start()


async def fill_call_slots(channel, live, slots: int):
    """`slots` stalled calls holding every call slot of the server, and the refusal of a call
    made then: (the stalled calls, the refusal). A stalled call that lost the race for a slot to
    the probing call is replaced."""
    async def fill():
        calls = []
        while True:
            calls = [call for call in calls if not call.done()]
            calls += [stalled_infer(channel) for _ in range(slots - len(calls))]
            try:
                await live(pb.ServerLiveRequest())
            except grpc.aio.AioRpcError as e:
                return calls, e
            await asyncio.sleep(0.01)
    return await asyncio.wait_for(fill(), 30)  # a hang guard, not a timing check


async def served_once_free(infer, request):
    """The answer to `request` once a call slot is free: the server frees a slot after the call
    holding it has ended on the client's side (its cancellation seen, its answer sent), so a call
    made at once may still be refused."""
    while True:
        try:
            return await infer(request)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            await asyncio.sleep(0.01)


def test_calls_beyond_the_limit_are_refused_and_the_server_serves_again(models_dir, tmp_path):
    """max_connections 2: two calls stalled before their message take both call slots; the
    next call is refused at once; when one of them goes, calls are served again."""
    srv = small_server(models_dir, tmp_path, max_connections=2)
    try:
        async def scenario():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.config.grpc_port}") as channel:
                infer, live = stubs(channel)
                await live(pb.ServerLiveRequest())
                stalled, refusal = await fill_call_slots(channel, live, 2)
                stalled[0].cancel()
                request = pb.ModelInferRequest(model_name="double")
                request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
                request.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
                served = await asyncio.wait_for(served_once_free(infer, request), 30)  # a hang guard
                stalled[1].cancel()
                return refusal, served
        refusal, served = asyncio.run(scenario())
    finally:
        srv.close()
    assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in refusal.details()
    assert np.frombuffer(served.raw_output_contents[0], np.float32).tolist() == [2.0] * 16
    assert srv.error is None


def grpc_refused(srv, reason: str) -> float:
    return metric(srv.url, "aclserve_grpc_calls_refused_total", f'reason="{reason}"')


def test_calls_grpc_refuses_itself_are_counted(models_dir, tmp_path):
    """grpc.aio answers a call over the call limit RESOURCE_EXHAUSTED and one of a method not
    served UNIMPLEMENTED before any handler runs: /metrics saw neither (a review), where HTTP
    counts the connections over its cap. max_connections 2: two calls stalled before their
    message (each reading: aclserve_grpc_receiving) hold both slots; every refusal a client
    sees is counted, and no call served is."""
    srv = small_server(models_dir, tmp_path, max_connections=2)
    request = pb.ModelInferRequest(model_name="double")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())

    async def refused_or_served(call) -> bool:
        try:
            await call
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in e.details(), e
            return True
        return False

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.config.grpc_port}") as channel:
            infer, live = stubs(channel)
            stalled = []
            for held in (1, 2):  # one after the other: each is in its handler before the next comes
                stalled.append(stalled_infer(channel))
                await wait_for(lambda: metric(srv.url, "aclserve_grpc_receiving") == held)
            refused = [await refused_or_served(live(pb.ServerLiveRequest())) for _ in range(3)]
            with pytest.raises(grpc.aio.AioRpcError) as unknown:  # (looked up before the limit)
                await channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")(b"")
            counted_full = grpc_refused(srv, "call_limit"), grpc_refused(srv, "unknown_method")
            for call in stalled:
                call.cancel()
            seen = sum(refused)
            while await refused_or_served(infer(request)):  # refused until a slot is free
                seen += 1
            for _ in range(5):
                assert not await refused_or_served(infer(request))
            return refused, unknown.value, counted_full, seen
    try:
        refused, unknown, counted_full, seen = asyncio.run(scenario())
        assert refused == [True] * 3
        assert unknown.code() == grpc.StatusCode.UNIMPLEMENTED and unknown.details() == "Method not found!"
        assert counted_full == (3, 1)
        assert grpc_refused(srv, "call_limit") == seen and grpc_refused(srv, "unknown_method") == 1
    finally:
        srv.close()
    assert srv.error is None


# -- shutdown --------------------------------------------------------------------------------------

def test_shutdown_does_not_wait_for_a_stalled_call(models_dir, tmp_path):
    """max_connections 1: the stalled call holds the only call slot (which tells the test it is
    in); its message timeout (10 min) is far off; shutdown ends it after shutdown_timeout_s."""
    srv = small_server(models_dir, tmp_path, max_connections=1, shutdown_timeout_s=0.5)

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.config.grpc_port}") as channel:
            _, live = stubs(channel)
            await live(pb.ServerLiveRequest())
            (call,), _ = await fill_call_slots(channel, live, 1)
            await asyncio.get_running_loop().run_in_executor(None, srv.close)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            return e.value
    error = asyncio.run(scenario())
    assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), error
    assert srv.error is None and not srv._thread.is_alive()
