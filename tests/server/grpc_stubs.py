"""Callables for the gRPC tests' own channels (grpc.aio): ModelInfer and ServerLive as raw
unary-unary stubs, and a ModelInfer call whose client never sends its message."""
from __future__ import annotations

import asyncio

from tritonclient.grpc import service_pb2 as pb

from .grpc_raw import INFER, LIVE


def stubs(channel):
    infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
    live = channel.unary_unary(LIVE, pb.ServerLiveRequest.SerializeToString, pb.ServerLiveResponse.FromString)
    return infer, live


def stalled_infer(channel, method: str = INFER):
    """A ModelInfer call (or one of `method`) whose client sends its headers and never its
    message (a client-streaming call on the same method is the same on the wire as a unary one
    that stalls)."""
    async def nothing():
        await asyncio.Event().wait()
        yield b""  # pragma: no cover
    return channel.stream_unary(method, None, pb.ModelInferResponse.FromString)(nothing())
