"""One hostile HTTP/2 connection against everyone else's gRPC calls (a tester, t89): calls whose
answers are never taken (a window of 0) and calls cancelled as they are opened (HTTP/2 rapid
reset), which grpc_max_concurrent_streams bounds (calls queued by the thousand that never send
their message: test_grpc_arrivals.py). A real server on a real port, raw HTTP/2 frames on one
connection and a grpc.aio client on another."""
from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import threading

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.serving import free_port, server_config, started_with_grpc
from .grpc_raw import (DATA, HEADERS, INFER, LIVE, OWN_CONNECTION, PREFACE, RST_STREAM, SETTINGS, affine,
                       call_headers, frame, whole_frames)
from .grpc_stubs import stubs
from .hostile import wait_for

REFUSED_STREAM, CANCEL = 7, 8


@pytest.fixture
def capped(models_dir, tmp_path):
    """Eight calls at once in all (max_connections), four on one connection."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    yield from started_with_grpc(server_config(
        tmp_path, grpc_port=free_port(), model_control_mode="none", max_connections=8,
        grpc_max_concurrent_streams=4))


class RawConnection:
    """An HTTP/2 connection of raw frames: the client's SETTINGS (`settings`: (id, value) pairs)
    sent, the server's acknowledged, then what the server sends is read on a thread of its own,
    acknowledging its SETTINGS, and kept as (type, flags, stream, payload)."""

    def __init__(self, port: int, settings: tuple = ()):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.frames: list[tuple] = []
        self._lock = threading.Lock()
        payload = b"".join(struct.pack(">HI", key, value) for key, value in settings)
        self.send(PREFACE + frame(SETTINGS, 0, 0, payload))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        data = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            frames, data = whole_frames(data + chunk)
            self.frames += frames
            if any(kind == SETTINGS and not flags & 1 for kind, flags, _, _ in frames):
                self.send(frame(SETTINGS, 1, 0))

    def refused(self) -> set[int]:
        """The streams the server refused (RST_STREAM REFUSED_STREAM)."""
        return {stream for kind, _, stream, payload in list(self.frames)
                if kind == RST_STREAM and int.from_bytes(payload, "big") == REFUSED_STREAM}

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # (ends the reader's recv, which close() alone may not)
        except OSError:
            pass
        self._reader.join(30)
        self.sock.close()


def settings_acknowledged(connection: RawConnection) -> bool:
    """The server has acknowledged the client's SETTINGS (so that they hold for its calls)."""
    return any(kind == SETTINGS and flags & 1 for kind, flags, _, _ in list(connection.frames))


def test_one_connection_whose_answers_are_never_taken_cannot_take_every_call(capped):
    """Twelve ServerLive calls on a connection that takes no answer (SETTINGS_INITIAL_WINDOW_SIZE
    0) held all eight calls the server runs at once (5,000 of them, all 4,096: every other call
    was refused "Concurrent RPC limit exceeded!" for 30 s); now the connection gets four, its
    other calls refused REFUSED_STREAM, and another client's call is answered."""
    port = capped.config.grpc_port
    hostile = RawConnection(port, settings=((4, 0),))
    try:
        asyncio.run(wait_for(lambda: settings_acknowledged(hostile)))
        message = b"\x00" + struct.pack(">I", 0)  # an empty ServerLiveRequest
        streams = range(1, 24, 2)
        hostile.send(b"".join(call_headers(LIVE, f"127.0.0.1:{port}", stream) + frame(DATA, 0x1, stream, message)
                              for stream in streams))

        def each_heard() -> bool:  # answer headers (its message waits for a window), or refused
            heard = {stream for kind, _, stream, _ in list(hostile.frames) if kind in (HEADERS, RST_STREAM)}
            return heard >= set(streams)
        asyncio.run(wait_for(each_heard))

        async def live():
            async with grpc.aio.insecure_channel(capped.grpc_url, options=OWN_CONNECTION) as channel:
                return await asyncio.wait_for(stubs(channel)[1](pb.ServerLiveRequest()), 30)
        answer = asyncio.run(live())
        refused = hostile.refused()
    finally:
        hostile.close()
    assert answer.live
    assert len(refused) >= len(streams) - 4, refused


def test_calls_cancelled_as_they_are_opened_are_refused_past_the_cap_and_others_are_served(capped):
    """HTTP/2 rapid reset: a connection opens calls and cancels each at once (HEADERS, then
    RST_STREAM), thousands in a burst, while a client infers on another connection. grpc counts a
    cancelled call against the connection's cap until the server has cleaned it up, so the flood
    gets calls refused REFUSED_STREAM (with no cap, none: a good client had calls ended
    CANCELLED, one in ten or more) and every inference is answered."""
    port = capped.config.grpc_port
    hostile = RawConnection(port)
    flooding = threading.Event()

    def flood():
        stream = 1
        for _ in range(40):
            burst = []
            for _ in range(100):
                burst.append(call_headers(INFER, f"127.0.0.1:{port}", stream))
                burst.append(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
                stream += 2
            hostile.send(b"".join(burst))
            flooding.set()

    async def infer_meanwhile():
        async with grpc.aio.insecure_channel(capped.grpc_url, options=OWN_CONNECTION) as channel:
            infer, _ = stubs(channel)
            return [await asyncio.wait_for(infer(affine(1, request_id=str(i))), 30) for i in range(20)]
    try:
        asyncio.run(wait_for(lambda: settings_acknowledged(hostile)))
        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        flooding.wait(30)
        answers = asyncio.run(infer_meanwhile())
        flooder.join(60)
        asyncio.run(wait_for(hostile.refused))
    finally:
        hostile.close()
    assert [a.id for a in answers] == [str(i) for i in range(20)]
