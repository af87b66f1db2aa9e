"""Client keepalive pings over gRPC, as Triton's docs have clients set them (tritonclient's
KeepAliveOptions: permit without calls, no cap of pings without data): the server's
grpc_keepalive_permit_without_calls, grpc_min_ping_interval_s and grpc_max_ping_strikes decide
which it takes. A tester's stream from a client pinging every 10 s died at 30 s "Too many pings"
(grpc's defaults, 5 minutes between pings, were all the server set). A real server, real clients
pinging every second; how many pings a client has sent is read from its channelz socket, so no
test sleeps for a set time."""
from __future__ import annotations

import asyncio
import json
import queue
import shutil
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc._cython import cygrpc
from tritonclient.grpc import service_pb2 as pb

from tests.serving import ServerThread, free_port, server_config, started_with_grpc

from .grpc_raw import INFER, affine

PINGING = grpcclient.KeepAliveOptions(keepalive_time_ms=1000, keepalive_timeout_ms=20000,
                                      keepalive_permit_without_calls=True, http2_max_pings_without_data=0)
PINGING_OPTIONS = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 20000),
                   ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
# past the strikes gRPC's defaults allow (2: the fourth ping with nothing sent between closes)
PINGS_PAST_STRIKES = 5


def client_socket(target: str) -> tuple[int, int] | None:
    """(socket id, keepalive pings it has sent) of this process's client connection to `target`;
    None when there is none (the server closed it)."""
    for channel in json.loads(cygrpc.channelz_get_top_channels(0)).get("channel", []):
        if not channel["data"].get("target", "").endswith(target):
            continue
        for sub in channel.get("subchannelRef", []):
            found = json.loads(cygrpc.channelz_get_subchannel(int(sub["subchannelId"])))["subchannel"]
            for ref in found.get("socketRef", []):
                socket = json.loads(cygrpc.channelz_get_socket(int(ref["socketId"])))["socket"]
                return int(ref["socketId"]), int(socket["data"].get("keepAlivesSent", 0))
    return None


def pinged(target: str, count: int, guard_s: float = 120.0) -> int | None:
    """Wait until the client's connection to `target` has sent `count` keepalive pings: its socket
    id then, or None as soon as it has gone (or at the hang guard)."""
    first = client_socket(target)
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        now = client_socket(target)
        if now is None or first is None or now[0] != first[0]:
            return None
        if now[1] >= count:
            return now[0]
        time.sleep(0.05)
    return None


def config(models_dir, root, **settings):
    """A server of the affine model with gRPC on and `settings`."""
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    return server_config(root, grpc_port=free_port(), model_control_mode="none", **settings)


def serving(config) -> ServerThread:
    srv = ServerThread(config)
    srv.grpc_url = f"127.0.0.1:{config.grpc_port}"
    return srv


@pytest.fixture(params=[dict(grpc_min_ping_interval_s=0.5), dict(grpc_min_ping_interval_s=60, grpc_max_ping_strikes=0)],
                ids=["interval", "no_strike_limit"])
def lenient(request, models_dir, tmp_path):
    yield from started_with_grpc(config(models_dir, tmp_path, **request.param))


def affine_inputs(value: float) -> list:
    x = grpcclient.InferInput("x", [1, 8], "FP32")
    x.set_data_from_numpy(np.full((1, 8), value, np.float32))
    idx = grpcclient.InferInput("idx", [1, 3], "INT64")
    idx.set_data_from_numpy(np.ones((1, 3), np.int64))
    return [x, idx]


def test_an_idle_stream_outlives_the_strikes_of_a_client_pinging_every_second(lenient):
    """tritonclient's stream, quiet between two requests while its client pings every second:
    pings past gRPC's strikes are taken (an interval under the client's, or no strike limit),
    and the stream answers its next request on the same connection."""
    client = grpcclient.InferenceServerClient(lenient.grpc_url, keepalive_options=PINGING)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("affine", affine_inputs(1.0), request_id="before")
        result, error = answers.get(timeout=60)
        assert error is None, error
        connection = pinged(lenient.grpc_url, client_socket(lenient.grpc_url)[1] + PINGS_PAST_STRIKES)
        assert connection is not None, "the server closed the connection of a client pinging every second"
        client.async_stream_infer("affine", affine_inputs(2.0), request_id="after")
        result, error = answers.get(timeout=60)
        assert error is None, error
        assert result.get_response().id == "after" and client_socket(lenient.grpc_url)[0] == connection
    finally:
        client.stop_stream()
        client.close()


def test_the_defaults_still_close_a_client_pinging_every_second(models_dir, tmp_path):
    """The default interval (5 s) takes a client pinging every 10 s, not one pinging every second:
    its idle stream's connection is closed, the stream ended UNAVAILABLE "Too many pings"."""
    with serving(config(models_dir, tmp_path)) as srv:
        client = grpcclient.InferenceServerClient(srv.grpc_url, keepalive_options=PINGING)
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("affine", affine_inputs(1.0))
            assert answers.get(timeout=60)[1] is None
            result, error = answers.get(timeout=120)  # the stream's end
            assert result is None and "Too many pings" in str(error), error
        finally:
            client.stop_stream()
            client.close()


@pytest.mark.parametrize("permit", [True, False])
def test_pings_on_a_connection_without_calls_follow_grpc_keepalive_permit_without_calls(models_dir, tmp_path, permit):
    """A connection between unary calls, its client pinging every second. Permitted (the
    default), the pings are taken and the next call goes on the same connection; not
    permitted, gRPC's rule for such a connection (one ping every 2 hours) closes it
    "too_many_pings". keepalive_timeout_s, which closes a connection without calls whatever its
    pings, is set past the test."""
    settings = dict(grpc_min_ping_interval_s=0.5, keepalive_timeout_s=600, grpc_keepalive_permit_without_calls=permit)
    with serving(config(models_dir, tmp_path, **settings)) as srv:
        async def scenario():
            async with grpc.aio.insecure_channel(srv.grpc_url, options=PINGING_OPTIONS) as channel:
                infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString,
                                            pb.ModelInferResponse.FromString)
                await infer(affine(1))
                start = client_socket(srv.grpc_url)
                connection = await asyncio.to_thread(pinged, srv.grpc_url, start[1] + PINGS_PAST_STRIKES)
                await infer(affine(1))
                return start[0], connection, client_socket(srv.grpc_url)[0]
        first, kept, last = asyncio.run(scenario())
        if permit:
            assert kept == first == last
        else:
            assert kept is None and last != first  # closed, the next call on a new connection
