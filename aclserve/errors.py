"""Typed errors whose message is safe to show to a client; every layer raises them.

They say what went wrong, not how a protocol spells it: the server maps each class to an HTTP
status and a gRPC code at its edge (server/http_errors.py, server/grpc_status.py). Anything
that is not a ServeError reaching the server is an internal fault: logged with its traceback
and answered with a generic 500 / INTERNAL. The Python API (runtime/engine.py) raises them to its
caller as they are; `aclserve` exports those a caller of it catches (README, "the Python API").
"""
from __future__ import annotations


class ServeError(Exception):
    """Root of errors whose message is safe to show to a client. `request_id`: the request's
    own id when the refusal came after it was read (a body whose tensors do not fit its model),
    for the request log and traces. `retry_after_s`: when a refusal knows when to come back (a
    load whose automatic retry is armed), else the protocol edge's table decides."""

    request_id: str | None = None
    retry_after_s: float | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(ServeError):
    """The request is malformed or does not match the model (names, dtypes, shapes, sizes)."""


class MalformedRequest(InvalidInput):
    """Refused whatever model it is for: its JSON does not parse, or its header length does not
    fit its body (a model replaced while it arrived changes nothing: ServedModel.invalid_since_retired
    is not asked)."""


class NotFound(ServeError):
    """Unknown model, version or route."""


class PayloadTooLarge(ServeError):
    """The request is larger than a configured limit (body, JSON part, request memory)."""


class Unavailable(ServeError):
    """The request cannot be served now (queue full, not ready, shutting down, timed out);
    the client may try again shortly."""


class Overloaded(Unavailable):
    """The server has no room for the request now (a full queue, request memory in use,
    image decoding saturated). HTTP holds the connection for the Retry-After it announces."""


class QueueFull(Overloaded):
    pass


class RequestTimeout(Unavailable):
    """The request's deadline passed while it was queued (Triton answers UNAVAILABLE too)."""


class ShuttingDown(Unavailable):
    pass


class ModelUnavailable(Unavailable):
    """The model version is not ready (loading, draining, failed)."""


class ExecutionFailed(ServeError):
    """The device failed the batch this request was in; the message says what happened."""


class DeviceFailed(ExecutionFailed):
    """The device failed as a whole (an HBM multi-bit ECC error, say: runtime/device_health.py):
    nothing runs on it until it is reset, which takes a restart of the process. The server
    drains and exits for its supervisor to restart it; the Python API's caller closes its
    Engine and starts again in a new process."""


class Closed(ExecutionFailed, RuntimeError):
    """The Python API's model, or the Engine holding it, is closed: a load or call made since,
    or a call that a close bounded in time did not wait for. An ExecutionFailed, as a call on a
    closed model failed before, and a RuntimeError, as a call or load on a closed Engine raised.
    The server never answers it (its versions' unloads answer ShuttingDown)."""


class LoadError(RuntimeError):
    """A model could not be loaded (unreadable or unsupported OM, out of device memory, streams or
    events, ...). Not a ServeError: the repository says it in its index (ModelLoadFailed)."""


class DeviceTimeout(Unavailable):
    """The device did not finish the batch within the model's execution timeout; the instance
    is being rebuilt, so a retry is likely to succeed."""
