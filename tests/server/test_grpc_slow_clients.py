"""gRPC clients that are slow on either side: answers a client does not take (a stream's, a
unary call's), calls whose message never comes (every method, not only inference), and what a
call may send before its handler reads. A real server on real ports, driven by grpc.aio
channels and, for a client that stops reading (a zero flow-control window) or never sends,
raw HTTP/2 frames on a socket."""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import struct
import urllib.request

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2 as pb

from aclserve.config import ConfigError
from aclserve.server.grpc_server import server_options

from tests.serving import ServerThread, free_port, server_config, started_with_grpc
from tests.tiny_models import compile_cpu_om, save_graph
from .hostile import wait_for
from .grpc_raw import (DATA, GOAWAY, INFER, LIVE, PREFACE, SETTINGS, STREAM, affine, call_headers, frame,
                       frames_until_closed)
from .test_grpc_guards import in_use

WIDE_ROW = 16384 * 4  # bytes of one row of the wide model's output: more than a 64 KB window


def wide_onnx(path) -> str:
    """y = x tiled 1024 times (FP32 [N,16] -> [N,16384]): 64 KiB of answer per row."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16384])
    reps = numpy_helper.from_array(np.array([1, 1024], np.int64), "reps")
    return save_graph(helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "wide", [x], [y], [reps]),
                      path)


def wide(request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="wide", id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
    return request


def grpc_message(request: pb.ModelInferRequest) -> bytes:
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def zero_window_settings() -> bytes:
    """The client's SETTINGS: SETTINGS_INITIAL_WINDOW_SIZE 0, so no answer can come until it
    sends a WINDOW_UPDATE, which these clients never do (they stop reading)."""
    return frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0))


@pytest.fixture(scope="module")
def models(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_slow_models")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    compile_cpu_om(wide_onnx(tmp_path_factory.mktemp("grpc_slow_src") / "wide.onnx"), root / "wide.om", batch="1,2")
    return root


@pytest.fixture(scope="module")
def slow(models):
    """Half-second body timeout; connections live as long as their clients keep them."""
    yield from started_with_grpc(server_config(models, grpc_port=free_port(), model_control_mode="none",
                                               body_timeout_s=0.5, grpc_max_connection_age_s=0))


def rows_run(srv, model: str) -> int:
    stats = json.loads(urllib.request.urlopen(f"http://{srv.url}/v2/models/{model}/stats", timeout=30).read())
    return stats["model_stats"][0]["inference_count"]


# -- answers the client does not take ---------------------------------------------------------------

def test_a_stream_whose_answers_are_not_taken_ends_and_gives_their_memory_back(slow):
    """Eight requests on a stream whose client reads nothing (its window: 64 KB, less than one
    answer). The first answer waits on the client; after body_timeout_s the stream gives up:
    the other answers are dropped and their memory charge given back, only the answer grpc
    holds stays charged. When the client reads at last it gets that answer, then
    DEADLINE_EXCEEDED saying why; nothing is left charged."""
    before = rows_run(slow, "wide")

    async def scenario():
        async with grpc.aio.insecure_channel(slow.grpc_url, options=[("grpc.http2.bdp_probe", 0)]) as channel:
            call = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                         pb.ModelStreamInferResponse.FromString)()
            for i in range(8):
                await call.write(wide(f"r{i}"))
            # reading nothing: the eight run, their answers charged, then the stream gives up on
            # the one not taken and the charge falls (the limits are hang guards)
            await wait_for(lambda: rows_run(slow, "wide") == before + 8)
            try:
                await wait_for(lambda: in_use(slow) < 2 * 3 * WIDE_ROW)
            except asyncio.TimeoutError:
                pytest.fail(f"more than the one answer grpc holds is still charged: {in_use(slow):g} bytes")
            held = in_use(slow)
            answers = []
            with pytest.raises(grpc.aio.AioRpcError) as e:
                while True:
                    answers.append(await asyncio.wait_for(call.read(), 30))  # a hang guard
            return held, answers, e.value
    held, answers, error = asyncio.run(scenario())
    assert 0 < held < 2 * 3 * WIDE_ROW, "the answer grpc holds is not charged"
    assert 1 <= len(answers) < 8 and all(not a.error_message for a in answers)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
    assert "not read" in error.details() and "body_timeout_s" in error.details()
    assert in_use(slow) == 0


def test_an_infer_answer_the_client_does_not_take_stays_charged_until_the_call_ends(slow):
    """A ModelInfer whose client stops reading (a zero window): its answer is made, and grpc
    holds it, charged to the memory budget, until the client reads or goes."""
    before = rows_run(slow, "affine")
    with socket.create_connection(("127.0.0.1", slow.config.grpc_port)) as sock:
        sock.sendall(PREFACE + zero_window_settings() + call_headers(INFER, slow.grpc_url)
                     + frame(DATA, 0x1, 1, grpc_message(affine(2))))
        asyncio.run(wait_for(lambda: rows_run(slow, "affine") >= before + 2))  # answered, not taken
        assert in_use(slow) > 0
    asyncio.run(wait_for(lambda: in_use(slow) == 0))  # the client went: the call ended


def test_calls_whose_answers_are_not_taken_end_with_their_connection_age(models, tmp_path):
    """max_connections 2: a client that stops reading holds both call slots, a ModelInfer and a
    ModelStreamInfer each with an answer grpc cannot send. grpc gives a handler no way to end
    such a call; the connection's age does (grpc_max_connection_age_s, then shutdown_timeout_s
    of grace): the connection is closed, the slots and the answers' memory come back."""
    srv = ServerThread(server_config(models, grpc_port=free_port(), model_control_mode="none", max_connections=2,
                                     grpc_max_connection_age_s=1, shutdown_timeout_s=0.5)).start()
    url = f"127.0.0.1:{srv.config.grpc_port}"
    try:
        with socket.create_connection(("127.0.0.1", srv.config.grpc_port)) as sock:
            sock.sendall(PREFACE + zero_window_settings()
                         + call_headers(INFER, url, 1) + frame(DATA, 0x1, 1, grpc_message(affine(2)))
                         + call_headers(STREAM, url, 3) + frame(DATA, 0, 3, grpc_message(affine(1))))
            frames = frames_until_closed(sock)  # acknowledges pings, never opens its window
        assert (GOAWAY, 0, 0) in frames

        async def served():
            await wait_for(lambda: in_use(srv) == 0)
            async with grpc.aio.insecure_channel(url) as channel:
                infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString,
                                            pb.ModelInferResponse.FromString)
                return await infer(affine(1))
        assert len(asyncio.run(served()).raw_output_contents) == 2
    finally:
        srv.close()
    assert srv.error is None


# -- messages that do not come -----------------------------------------------------------------------

@pytest.mark.parametrize("method", ["ServerLive", "ServerReady", "ModelMetadata", "RepositoryIndex"])
def test_a_call_of_any_method_whose_message_does_not_come_is_ended(slow, method):
    async def scenario():
        async def nothing():
            await asyncio.Event().wait()
            yield b""  # pragma: no cover
        async with grpc.aio.insecure_channel(slow.grpc_url) as channel:
            call = channel.stream_unary(f"/inference.GRPCInferenceService/{method}")(nothing())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(call, 30)  # a hang guard
            return e.value
    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "body_timeout_s" in error.details()


def test_a_message_that_is_not_the_methods_request_is_invalid_argument(slow):
    async def scenario():
        async with grpc.aio.insecure_channel(slow.grpc_url) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await channel.unary_unary(LIVE)(b"\xff\xff")  # a varint that never ends
            live = await channel.unary_unary(LIVE, pb.ServerLiveRequest.SerializeToString,
                                             pb.ServerLiveResponse.FromString)(pb.ServerLiveRequest())
            return e.value, live
    error, live = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "ServerLiveRequest" in error.details()
    assert live.live


# -- what a call may send before its handler reads ---------------------------------------------------

def test_a_stream_may_send_64_kb_before_its_handler_reads(slow):
    """grpc's BDP probing would offer every new stream a 4 MiB window, which a client may fill
    before the handler reads (on each of the streams of a connection); the server offers 64 KB."""
    with socket.create_connection(("127.0.0.1", slow.config.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        sock.settimeout(30)
        data = b""
        while len(data) < 9 or len(data) < 9 + int.from_bytes(data[:3], "big"):
            data += sock.recv(65536)
    assert data[3] == SETTINGS
    payload = data[9:9 + int.from_bytes(data[:3], "big")]
    settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
    assert settings.get(4, 65535) <= 65536


def test_server_options_follow_the_config(models):
    def options(**overrides):
        return dict(server_options(server_config(models, **overrides), 1 << 20, 10))
    aged = options(grpc_max_connection_age_s=600, shutdown_timeout_s=30)
    assert aged["grpc.max_connection_age_ms"] == 600_000 and aged["grpc.max_connection_age_grace_ms"] == 30_000
    assert aged["grpc.http2.bdp_probe"] == 0
    assert "grpc.max_connection_age_ms" not in options(grpc_max_connection_age_s=0)
    assert aged["grpc.max_concurrent_streams"] == 250 and aged["grpc.http.overload_protection"] == 1
    assert options(grpc_max_concurrent_streams=8)["grpc.max_concurrent_streams"] == 8
    with pytest.raises(ConfigError, match="grpc_max_connection_age_s"):
        server_config(models, grpc_max_connection_age_s=-1)
