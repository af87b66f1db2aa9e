"""A ModelInfer message from the wire to a parsed request: received within the body timeout,
charged to the server's memory budget before protobuf parses it (one refused then is counted on
the model it names: count_unparsed).

The gRPC counterpart of body.py. ModelInfer and ModelStreamInfer take raw bytes (see
grpc_server.method_handlers), so nothing is parsed before it is charged: first the message as
received, then what parsing and decoding it will hold at most (grpc_wire.scan), on the same
MemoryBudget as HTTP requests (413 / RESOURCE_EXHAUSTED when the request alone is over
`max_request_bytes`, 503 / UNAVAILABLE while other requests hold the budget, or the model its
message names holds its share of it: the model is known once the message is, and the charge is
that model's from its first byte charged, when the repository serves that model: `look_up`).
A message the repository's lookup refuses is refused before any of it is charged, as over HTTP
(whose path is looked up before its body is read), whatever the budget holds: NotServed, with
what the lookup says (a model or version it has not, whatever the name's length: NOT_FOUND;
a version that cannot be one: INVALID_ARGUMENT; a model loading or unavailable: UNAVAILABLE,
the model's own message). So is one whose model_name or model_version is not UTF-8, which
protobuf refuses: INVALID_ARGUMENT in protobuf's words (NOT_UTF8), one naming no model, and one
whose input holds more packed values than decoding takes (grpc_codec.refuse_unparsed). The
caller owns the lease and releases it when the RPC (or the streamed request) ends, however it ends.

What the budget cannot see: gRPC does not announce a message's size before the message, so
grpc core holds it while it arrives (at most `grpc_max_message_bytes`, the server's
max_receive_message_length, per call receiving) and the charge comes when it is complete; how
many arrive at once is bounded instead (grpc_arrivals.py: a read waits for its place).
ModelInfer is registered client-streaming, the same as a unary call on the wire but with the
handler running from the call's headers on, so it reads its one message itself and a client
that stops sending gets DEADLINE_EXCEEDED after `body_timeout_s` (408 over HTTP) instead of
holding its call, and what it sent, until shutdown.
"""
from __future__ import annotations

import asyncio
import functools

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidInput, ServeError
from . import views
from .body import BodyTimeout, timeout_at
from .budget import Lease
from .deadline_wait import expire_now
from .grpc_arrivals import EVICT_AFTER_S, Arrival, Arrivals
from .grpc_codec import parsed, refuse_unparsed
from .grpc_wire import names, scan
from .infer_pipeline import counted_infer

# a 413's advice: the lease's (for what has no advice of its own), and a message's with typed contents
GRPC_HINT = "send smaller requests"
TYPED_CONTENTS_HINT = "send tensors in raw_input_contents rather than typed contents, or in smaller requests"
# a message of nothing but a model_name, or a model_version, that is not UTF-8 (the byte 0xff): a message
# whose name is not is refused as protobuf refuses these, before it is charged, not parsed uncharged
NOT_UTF8 = {"model_name": b"\x0a\x01\xff", "model_version": b"\x12\x01\xff"}


async def receive(context, timeout_s: float, arrivals: Arrivals, probe: bool = False) -> bytes:
    """The call's request message, which must arrive within `timeout_s`, read while it holds a
    slot of `arrivals` (waiting its turn within that time, a turn among its connection's reads,
    or, with `probe`, among the health and readiness calls' ahead of them: NoRoomToReceive when it
    has waited too long). Cancelled with the call."""
    message = await receive_next(context, timeout_s, arrivals, probe)
    if message is grpc.aio.EOF:
        raise InvalidInput("the call ended without a request message")
    return message


async def receive_next(context, timeout_s: float, arrivals: Arrivals, probe: bool = False):
    """As `receive`, the call's next message, or grpc.aio.EOF when its client has sent its last."""
    arrival = Arrival(probe=probe, source=context.peer())
    try:
        async with timeout_at(asyncio.get_running_loop().time() + timeout_s) as deadline:
            arrival.end_early = functools.partial(expire_now, deadline)
            await arrivals.admit(arrival)
            try:
                return await context.read()
            finally:
                arrivals.leave(arrival)
    except asyncio.TimeoutError:
        if arrival.evicted:
            raise BodyTimeout(f"request message not received {EVICT_AFTER_S:g} s after it began while other "
                              f"calls waited to send theirs (at most {arrivals.slots} messages are received "
                              f"at once: max_inflight_bytes / grpc_max_message_bytes)") from None
        raise BodyTimeout(f"request message not received within {timeout_s:g} s (body_timeout_s)") from None


def parse(message: bytes, lease: Lease, state) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """Charge `message` and what parsing and decoding it will hold to `lease`, the model's it
    names (its share of the budget: budget.py), then parse it: (the request, its
    raw_input_contents as views of `message`). Before anything is charged: NotServed when the
    model repository (`state`'s) does not serve the model and version it names; InvalidInput when a
    name is not UTF-8 or it names no model. Charged, not parsed: InvalidInput when an input holds
    more packed values than decoding takes (grpc_codec.refuse_unparsed, in decoding's words)."""
    layout = scan(message)  # InvalidInput: no protobuf message at all, too many fields or parameters entries
    for field, name in (("model_name", layout.model), ("model_version", layout.version)):
        if name is None:
            parsed(NOT_UTF8[field])  # (a protobuf taking such a name: the message is charged and parsed)
    served = None
    if layout.model is not None and layout.version is not None:
        served = look_up(state.repo, views.model_name(layout.model), layout.version)  # (no name: INVALID_ARGUMENT)
        lease.attribute(layout.model)
    hint = TYPED_CONTENTS_HINT if layout.typed else None
    lease.take(len(message), "its message", hint)
    lease.take(layout.cost, "parsing and decoding its message", hint)
    if served is not None:  # refused where decoding would refuse it: charged first, as it was
        refuse_unparsed(layout, state.record(served).signature)
    return parsed(message), layout.raw_contents


class NotServed(Exception):
    """`parse`'s refusal of a message whose model and version the repository does not serve, with
    the lookup's error (NotFound, InvalidInput: a version that is none, ModelUnavailable, or
    ShuttingDown), before it is charged, as HTTP looks its path's model up before it reads the
    body: the caller has counted_infer refuse it, whose own lookup, with no await between, fails
    the same way and logs it as any request naming one (and a full budget does not answer
    UNAVAILABLE for it, nor does it hold a charge)."""

    def __init__(self, model: str, version: str | None, error: ServeError):
        super().__init__(error.message)
        self.model, self.version, self.error = model, version, error


def look_up(repo, model: str, version: str):
    """The version of `model` `repo` serves (`version`: "" for its newest), else NotServed. Only then is a
    message charged, and as its model's, as an HTTP body once counted_infer has found its path's
    model, before reading it: charged first, a name no model has showed as a label of
    aclserve_request_memory_model_bytes, a flood of it could be refused for that name's share
    (UNAVAILABLE) instead of NOT_FOUND, and a model loading got the budget's UNAVAILABLE instead
    of its own while the budget was full. The names are whole, as parsed: looked up again, they
    fail the same way (a name too long for any model's is refused by its length)."""
    try:
        return repo.get(model, version or None)
    except ServeError as e:
        # its frames hold the message (parse's, infer's): kept by the refusal, held until a full collection
        e.__traceback__ = None
        raise NotServed(model, version or None, e) from None


async def count_unparsed(state, message: bytes, refusal: ServeError, fallback_id: str | None,
                         when_sent=None) -> None:
    """A message `parse` refused (not protobuf, over the memory budget, an input over what decoding
    takes) counts as a failure of
    the model it names, as far as it can be read, like an HTTP body refused while decoded (its
    model is in its URL): statistics, /metrics and the request log alike (`when_sent`: a
    stream's, logged when its answer leaves). Nothing when it names no model that is served."""
    model, version, known_id = names(message)
    try:
        state.repo.get(model, version or None)
    except ServeError:
        return

    async def refused(rec, trace):
        raise refusal
    try:
        await counted_infer(state, model, version or None, refused, protocol="grpc", known_id=known_id or fallback_id,
                            when_sent=when_sent)
    except ServeError:
        pass  # the refusal: the caller raises it
