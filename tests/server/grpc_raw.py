"""What the gRPC tests send by hand: the affine model's ModelInferRequest, and raw HTTP/2
frames (a call's HEADERS, DATA; reading what the server sends until it closes) for what no
gRPC client does (half a message, a silent connection, a window never opened)."""
from __future__ import annotations

import gc
import socket
import struct

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from aclserve.server.grpc_stream import InferStream

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
CHECK = "/grpc.health.v1.Health/Check"
# a grpc channel option: a connection of its own (channels of the same target and options share one)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def affine(rows: int, model="affine", request_id="", typed=False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    x = request.inputs.add(name="x", datatype="FP32", shape=[rows, 8])
    idx = request.inputs.add(name="idx", datatype="INT64", shape=[rows, 3])
    if typed:
        x.contents.fp32_contents.extend([1.0] * rows * 8)
        idx.contents.int64_contents.extend([1] * rows * 3)
    else:
        request.raw_input_contents.extend([np.ones((rows, 8), np.float32).tobytes(),
                                           np.ones((rows, 3), np.int64).tobytes()])
    return request


def answers_made(count: int):
    """A condition: at least `count` answers made on the in-process server's open streams and
    waiting to be sent. Read from the streams themselves: a request's log line and trace end
    only once its answer is sent (observe.EndWhenSent)."""
    def made() -> bool:
        streams = [o for o in gc.get_objects() if isinstance(o, InferStream)]
        return sum(s._ready.qsize() + sum(m is not None for m in s._made.values()) for s in streams) >= count
    return made


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def call_headers(path: str, authority: str, stream: int = 1) -> bytes:
    """A HEADERS frame opening `stream` (HPACK literals without indexing, RFC 7541 6.2.2)."""
    block = b"".join(b"\x00" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode() for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers")])
    return frame(HEADERS, 0x4, stream, block)


def frames_until_closed(sock: socket.socket, answer: bool = True, limit_s: float = 30.0,
                        payloads: bool = False) -> list[tuple]:
    """(type, flags, stream) of every frame the server sends until it closes the connection, and
    its payload with `payloads`; with `answer`, its SETTINGS and PINGs are acknowledged as a
    client does (the limit is a hang guard)."""
    sock.settimeout(limit_s)
    data, found = b"", []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        frames, data = whole_frames(data + chunk)
        for kind, flags, stream, payload in frames:
            found.append((kind, flags, stream, payload) if payloads else (kind, flags, stream))
            if not answer:
                continue
            if kind == SETTINGS and not flags & 1:
                sock.sendall(frame(SETTINGS, 1, 0))
            elif kind == PING and not flags & 1:
                sock.sendall(frame(PING, 1, 0, payload))
    return found


def whole_frames(data: bytes) -> tuple[list[tuple], bytes]:
    """The whole frames at the start of `data`, each (type, flags, stream, payload), and what is
    left of it (a frame not whole yet)."""
    frames = []
    while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
        length, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
        frames.append((kind, flags, int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return frames, data
