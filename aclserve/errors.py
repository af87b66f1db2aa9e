"""Typed errors that carry their HTTP status; the server maps them to {"error": message}.

Anything that is not a ServeError reaching the server is an internal fault: logged with its
traceback and answered with a generic 500.
"""
from __future__ import annotations


class ServeError(Exception):
    """Root of errors whose message is safe to show to a client."""

    status = 500
    retry_after: float | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(ServeError):
    """The request is malformed or does not match the model (names, dtypes, shapes, sizes)."""

    status = 400


class NotFound(ServeError):
    """Unknown model, version or route."""

    status = 404


class PayloadTooLarge(ServeError):
    status = 413


class Unavailable(ServeError):
    """The request cannot be served now (queue full, not ready, shutting down, timed out)."""

    status = 503
    retry_after = 1.0


class QueueFull(Unavailable):
    pass


class RequestTimeout(Unavailable):
    """The request's deadline passed while it was queued (Triton answers UNAVAILABLE too)."""


class ShuttingDown(Unavailable):
    pass


class ModelUnavailable(Unavailable):
    """The model version is not ready (loading, draining, failed)."""


class Cancelled(ServeError):
    status = 400


class ExecutionFailed(ServeError):
    """The device failed the batch this request was in; the message says what happened."""

    status = 500


class DeviceTimeout(Unavailable):
    """The device did not finish the batch within the model's execution timeout; the instance
    is being rebuilt, so a retry is likely to succeed."""


class NotSupported(ServeError):
    status = 501
