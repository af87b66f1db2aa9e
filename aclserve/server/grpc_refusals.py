"""The gRPC calls grpc.aio answers itself, before any handler of the endpoint runs, counted for
/metrics (`aclserve_grpc_calls_refused_total`, by reason: guard_metrics.py writes it):

- `call_limit`: RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!", a call beyond
  maximum_concurrent_rpcs (`max_connections` calls at once: grpc_server.py);
- `unknown_method`: UNIMPLEMENTED "Method not found!", a method the endpoint does not serve.

grpc.aio decides both in the call's task, once it has asked the endpoint's one generic handler
(grpc_queued's dispatcher) for the method, by not running the handler it got; no hook sees the
refusal (a server interceptor runs before the limit is looked at, and on every call). So the
dispatcher counts the methods it does not serve (its miss branch: nothing for a served call),
and the calls refused for the limit are what is left of the calls it was asked for, once those
and the calls whose handler started (grpc_live.py) are taken away. That is exact at every
scrape: grpc.aio asks the dispatcher, then starts the handler or refuses the call, within one
step of the call's task, nothing awaited between (grpcio's aio server.pyx.pxi, _handle_rpc), and
a scrape reads the counts on the same loop.

Not counted, for want of a hook: a message over `grpc_max_message_bytes`, which grpc core
refuses RESOURCE_EXHAUSTED "Received message larger than max": the handler sees its read end
without a message and its call cancelled, as when a client cancels (README, "Every /metrics
family"); a model whose largest batch it would refuse is said as it loads (grpc_message_fit.py).
Event-loop thread only.
"""
from __future__ import annotations

from typing import Callable

CALL_LIMIT = "call_limit"
UNKNOWN_METHOD = "unknown_method"
# the same family's third reason, counted by the endpoint's handlers (grpc_arrivals.NoRoomToReceive)
NO_ROOM_TO_RECEIVE = "no_room_to_receive"


class GrpcRefusals:
    """Owned by the server state, so that the counts are on /metrics, at 0, with gRPC off too.
    The endpoint (grpc_server.GrpcServer) feeds it: `follow(asked, started)` gives its counts
    of the calls its dispatcher was asked for and of the handlers started, and the dispatcher
    calls `method_not_found()` for each method it does not serve."""

    def __init__(self):
        self.unknown_methods = 0
        self._asked: Callable[[], int] = int  # (int() is 0: no endpoint)
        self._started: Callable[[], int] = int

    def follow(self, asked: Callable[[], int], started: Callable[[], int]) -> None:
        self._asked, self._started = asked, started

    def method_not_found(self) -> None:
        self.unknown_methods += 1

    def counts(self) -> dict[str, int]:
        """Reason -> calls refused so far."""
        return {CALL_LIMIT: self._asked() - self._started() - self.unknown_methods,
                UNKNOWN_METHOD: self.unknown_methods}
