"""GrpcServer.stop() without a drain before it (a start that failed after gRPC was listening,
serving ended otherwise): it ends grpc's stop begun with the drain's step and closes every
connection at once. grpc.aio's stop, called again while one runs, destroys the server once it
has stopped, and a first call whose grace ends then cancels the calls of the freed server: the
process died with a segmentation fault about once in a few hundred stops (first seen in CI).
Many stops in a process of their own, so a crash fails this test, not the suite. And a stop
cancelled while it waits (the shutdown's gather cancelled) does not leave the one after it,
serve()'s last, to return at once with the calls still open."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import time

from aclserve.server.grpc_server import GrpcServer

from tests.runtime.own_process import run_script
from tests.serving import server_config, started_app
from .grpc_raw import DATA, INFER, PREFACE, affine, call_headers, frame, frames_until_closed
from .hostile import wait_for
from .test_grpc_slow_clients import grpc_message, zero_window_settings

ROUNDS = 300  # the crash came within 200 rounds in every run tried

SCRIPT = """
import asyncio, json, sys
import grpc
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pbg
from aclserve.server.grpc_server import GrpcServer
from tests.serving import server_config, started_app

async def main(models, rounds):
    config = server_config(models)
    runner, state, *_ = await started_app(config)
    live = 0
    try:
        for _ in range(rounds):
            server = GrpcServer(state, config.max_body_bytes)
            port = await server.start("127.0.0.1", 0)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                live += (await pbg.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest())).live
            await server.stop()
    finally:
        await runner.cleanup()
    print(json.dumps({"live": live}))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def test_many_stops_without_a_drain_each_end_their_server(tmp_path):
    answered, _ = run_script(SCRIPT, str(tmp_path), str(ROUNDS))
    assert answered == {"live": ROUNDS}


FAR_S = 600  # the first stop's deadline: no test waits that long
HANG_GUARD_S = 60


def test_a_stop_cancelled_while_it_waits_leaves_the_next_to_end_every_call_by_its_own_deadline(
        models_dir, tmp_path, caplog):
    """A ModelInfer whose client stops reading (a zero window) stays live once its answer is
    made. The first stop, its deadline far, waits for that call and is cancelled; the stop
    after it (deadline: now) has grpc end the call and close the connection before it returns,
    where it returned at once and left both open until the first stop's deadline."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    caplog.set_level(logging.INFO, "aclserve.server.grpc_server")

    async def scenario():
        config = server_config(tmp_path, model_control_mode="none")
        runner, state, *_ = await started_app(config)
        server = GrpcServer(state, config.max_body_bytes)
        try:
            port = await server.start("127.0.0.1", 0)
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(PREFACE + zero_window_settings() + call_headers(INFER, f"127.0.0.1:{port}")
                             + frame(DATA, 0x1, 1, grpc_message(affine(2))))
                # answered, the answer held by grpc (charged until the call ends), not taken
                await wait_for(lambda: state.budget.used > 0 and state.infer_requests.count == 0)
                first = asyncio.ensure_future(server.stop(time.monotonic() + FAR_S))
                await asyncio.sleep(0.1)  # (it waits for the call whatever this is)
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first
                await asyncio.wait_for(server.stop(), HANG_GUARD_S)
                stopped = "gRPC endpoint stopped" in caplog.messages
                # until the connection closes (grpc's stop closed it; before, it stayed open past the stop)
                return stopped, await asyncio.get_running_loop().run_in_executor(
                    None, lambda: frames_until_closed(sock, answer=False, limit_s=HANG_GUARD_S))
        finally:
            await runner.cleanup()
    stopped, frames = asyncio.run(scenario())
    assert stopped, "the second stop returned before grpc had stopped"
    assert all(stream != 1 or kind != DATA for kind, _, stream in frames), "the answer went out through a zero window"
