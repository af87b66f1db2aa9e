"""A ModelInfer message from the wire to a parsed request, charged to the server's memory
budget before protobuf parses it.

The gRPC counterpart of body.py. ModelInfer and ModelStreamInfer take raw bytes (see
grpc_server.method_handlers), so nothing is parsed before it is charged: first the message as
received, then what parsing and decoding it will hold at most (grpc_wire.scan), on the same
MemoryBudget as HTTP requests (413 / RESOURCE_EXHAUSTED when the request alone is over
`max_request_bytes`, 503 / UNAVAILABLE while other requests hold the budget). The caller owns
the lease and releases it when the RPC (or the streamed request) ends, however it ends.

What the budget cannot see: gRPC does not announce a message's size before the message, so
grpc core holds it while it arrives (at most `max_body_bytes`, the server's
max_receive_message_length, per call receiving) and the charge comes when it is complete.
"""
from __future__ import annotations

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidInput
from .budget import Lease
from .grpc_wire import scan

GRPC_HINT = "send tensors in raw_input_contents rather than typed contents, or in smaller requests"


def parse(message: bytes, lease: Lease) -> tuple[pb.ModelInferRequest, list[memoryview] | None]:
    """Charge `message` and what parsing and decoding it will hold to `lease`, then parse it:
    (the request, its raw_input_contents as views of `message`, or None: see grpc_wire.Layout)."""
    layout = scan(message)  # InvalidInput when it is no protobuf message at all
    lease.take(len(message), "its message")
    lease.take(layout.cost, "parsing and decoding its message")
    try:
        request = pb.ModelInferRequest.FromString(message)
    except DecodeError as e:
        raise InvalidInput(f"request message is not a valid ModelInferRequest: {e}") from None
    return request, layout.raw_contents
