"""The gRPC calls not finished yet, counted from their handler's start until grpc has sent their
status (or cancelled them), so that the shutdown waits for calls and never for connections.

grpc's own stop cannot tell a connection without calls (one that sent only its preface, or said
hello and called nothing) from a busy one: it waits its whole grace for such a connection to
go. The endpoint's stop (grpc_server.GrpcServer.stop) instead waits until no call is live here,
then has grpc close every connection at once.

`counted(handler)` wraps an entry of the method table (grpc_server.method_handlers); the call
is live from the wrapper's first line until grpc runs the done callback it registers (after
the call's status has gone out, or the call was cancelled). A repository load or unload is live
but does not hold the drain, as over HTTP, where the drain waits for inference alone: a load can
compile and warm up for minutes, and the shutdown abandons it anyway (answered UNAVAILABLE).
The wrapper also passes every call through the endpoint's StopGate (grpc_gate.py): one started
while the gate is closed is refused once it opens, and an answer ready meanwhile waits for it.
"""
from __future__ import annotations

import grpc

from .grpc_gate import StopGate
from .in_flight import InFlight


class LiveCalls:
    """Owned by the endpoint (grpc_server.GrpcServer); event-loop thread only."""

    def __init__(self, gate: StopGate):
        self.all = InFlight()
        self.holding_drain = InFlight()  # all but repository control
        self.started = 0  # every call so far (the calls refused for the call limit are found from it: grpc_refusals.py)
        self._gate = gate

    def counted(self, handler: grpc.RpcMethodHandler, method: str, holds_drain: bool = True) -> grpc.RpcMethodHandler:
        """`handler` of `method` (client-streaming: every entry of the endpoint's table is) whose
        calls count here and pass the gate. A streaming answer is written by the wrapper as grpc
        would write it itself."""
        counts = (self.all, self.holding_drain) if holds_drain else (self.all,)
        gate = self._gate

        def opened(context) -> None:
            self.started += 1
            for count in counts:
                count.enter()
            context.add_done_callback(finished)

        def finished(_context) -> None:  # its status has gone out, or it was cancelled
            for count in counts:
                count.leave()

        if handler.request_streaming and handler.response_streaming:
            answers = handler.stream_stream

            async def stream_stream(requests, context):
                opened(context)
                async with gate.passing(context, method):
                    async for answer in answers(requests, context):
                        if gate.closed:
                            await gate.passed()
                        await context.write(answer)
            return handler._replace(stream_stream=stream_stream)
        if handler.request_streaming:
            answer = handler.stream_unary

            async def stream_unary(requests, context):
                opened(context)
                async with gate.passing(context, method):
                    return await answer(requests, context)
            return handler._replace(stream_unary=stream_unary)
        raise TypeError("the gRPC endpoint's methods are all client-streaming on its side")
