"""A ModelStreamInfer stream opened past the streams' cap (grpc_arrivals.Arrivals.open_stream)
is refused on the stream: its first request is answered with a ModelStreamInferResponse whose
error_message is the refusal (the cap and the config keys that raise it), named with the
request's id, then the stream ends UNAVAILABLE with the same message and a pushback.

Why an answer and not the status alone: Triton's C++ client, the one perf_analyzer runs, reads
a stream's answers and drops the status that ends it (grpc_client.cc, AsyncStreamTransfer: the
Status of its Finish() is not read), so a stream ended at its open was never seen to fail:
perf_analyzer printed figures for the concurrency asked for, though 8 of its 40 streams had sent
nothing, then waited forever for their answers. An error_message is what every Triton client
reads as a failed request (perf_analyzer stops with it; tritonclient's stream callback gets it,
then the status, which marks the stream as no longer usable). A client that opted into
Triton's `triton_grpc_error` gets the status alone, at the open, as it asked.

Why only the first request: the stream is refused for good (it would never be admitted later),
so it ends at once rather than fail request after request; it holds nothing meanwhile. Its one
message is read as a unary call's (grpc_intake.receive_next: in a place among the messages
arriving, within body_timeout_s, so what refused streams receive stays within the arrivals'
bound), only its names are kept (each cut at 256 characters: a few hundred bytes of answer),
and nothing is queued.
"""
from __future__ import annotations

import grpc

from ..errors import ServeError
from .body import BodyTimeout
from .grpc_arrivals import NoRoomToReceive, StreamsFull
from .grpc_codec import final_stream_response, stream_error_response
from .grpc_intake import receive_next
from .grpc_status import end_call
from .open_calls import OpenCalls


async def refused_stream(context, refusal: StreamsFull, ends_on_error: bool, state, calls: OpenCalls):
    """The answers of a stream refused with `refusal` (an async generator, the handler's to
    yield), its call ended with the refusal's status after them; `calls` ends the wait for the
    first message at shutdown. Cancelled with the call."""
    if not ends_on_error:
        try:
            with calls.at_work():  # not while the answer is sent (open_calls.py)
                message = await receive_next(context, state.config.body_timeout_s, state.grpc_arrivals)
        except (BodyTimeout, NoRoomToReceive):
            message = grpc.aio.EOF  # none came (in time): the refusal's status says why all the same
        except ServeError as e:  # ShuttingDown
            await end_call(context, e, "ModelStreamInfer", state.redact)
        if message is not grpc.aio.EOF:
            answer = final_stream_response(stream_error_response(message, state.redact(refusal.message)))
            del message  # not held while grpc sends the answer
            yield answer
    await end_call(context, refusal, "ModelStreamInfer", state.redact)
