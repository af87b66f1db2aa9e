"""The gRPC endpoint's lifecycle: one grpc.aio server on the running event loop (the HTTP app's
loop), serving InferenceServicer over the app's ServerState.

Built by the composition root (aclserve/app.py), handed to server.app.serve(), which owns it
from then on: started after the HTTP site (models are loaded by then), stopped before the HTTP
runner is cleaned up. Messages may be as large as the HTTP body limit
(`max_body_bytes`; gRPC's own default is 4 MiB); responses are not limited, as over HTTP.
"""
from __future__ import annotations

import logging

import grpc
from tritonclient.grpc import service_pb2_grpc as pbg

from .grpc_service import InferenceServicer

log = logging.getLogger(__name__)

MAX_MESSAGE = 2**31 - 1  # what protobuf can carry at all


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """Owns one grpc.aio.Server. start() binds and serves; stop() lets in-flight RPCs finish
    within `grace` seconds, then cancels them. stop() is idempotent."""

    def __init__(self, state, max_message_bytes: int):
        self.state = state
        self.port: int | None = None
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", min(max_message_bytes, MAX_MESSAGE)),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
        ])
        pbg.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(state), self._server)
        self._started = self._stopped = False

    async def start(self, host: str, port: int) -> int:
        """Bind host:port and serve; returns the bound port. OSError when it cannot bind."""
        try:
            bound = self._server.add_insecure_port(address(host, port))
        except RuntimeError as e:  # grpcio raises RuntimeError("Failed to bind ...")
            raise OSError(f"gRPC cannot listen on {address(host, port)}: {e}") from None
        if not bound:
            raise OSError(f"gRPC cannot listen on {address(host, port)}")
        await self._server.start()
        self._started = True
        self.port = bound
        return bound

    async def stop(self, grace: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._started:
            await self._server.stop(grace)
            log.info("gRPC endpoint stopped")
