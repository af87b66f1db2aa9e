"""How a gRPC call ends on an error, the one mapping of errors to statuses (Triton's): a
ServeError's class picks the code (STATUS_CODES) and its message goes to the client, with a
`grpc-retry-pushback-ms` trailer where HTTP sends Retry-After; a MemoryError is the host short of
memory (UNAVAILABLE: host_memory.py); anything else unexpected is logged with its traceback and
answered INTERNAL "internal error". Used by the inference and health services."""
from __future__ import annotations

import logging
from typing import Callable

import grpc

from ..errors import InvalidInput, NotFound, PayloadTooLarge, ServeError, Unavailable
from ..repository import ModelLoadFailed
from .auth import Forbidden, Unauthorized
from .body import BodyTimeout
from .host_memory import host_out_of_memory
from .http_errors import by_class, retry_after

log = logging.getLogger(__name__)

# the classes' HTTP statuses (http_errors.py) as Triton maps them; unlisted classes are INTERNAL
STATUS_CODES: dict[type[ServeError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT, ModelLoadFailed: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthorized: grpc.StatusCode.UNAUTHENTICATED, Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND, BodyTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED, Unavailable: grpc.StatusCode.UNAVAILABLE}


# Bytes of a status message on the wire: grpc sends it in the grpc-message trailer, each byte but
# printable ASCII percent-encoded (a '%' too); past 8 KB of metadata (grpc's soft limit) a client
# may get RESOURCE_EXHAUSTED "Stream removed" instead of the status, at random up to the hard 16 KB
STATUS_MESSAGE_BYTES = 4096
_SENT_AS_IS = bytes(b for b in range(0x20, 0x7F) if b != 0x25)


def fit_status_message(message: str) -> str:
    """`message` cut so that it is at most STATUS_MESSAGE_BYTES once percent-encoded (messages
    quote clients' values, cut at 8,192 characters by the redactor: an input named "/ " repeated
    came back as "Stream removed" one time in a few)."""
    if _wire_bytes(message) <= STATUS_MESSAGE_BYTES:
        return message
    low, high = 0, len(message)  # the longest prefix that fits, with room for the note after it
    while low < high:
        middle = (low + high + 1) // 2
        if _wire_bytes(message[:middle]) <= STATUS_MESSAGE_BYTES - 64:
            low = middle
        else:
            high = middle - 1
    return f"{message[:low]}... ({len(message) - low:,} more characters)"


def _wire_bytes(text: str) -> int:
    raw = text.encode("utf-8", "replace")
    return len(raw) + 2 * len(raw.translate(None, _SENT_AS_IS))


def status_code(error: ServeError) -> grpc.StatusCode:
    return by_class(STATUS_CODES, error, grpc.StatusCode.INTERNAL)


def pushback(error: ServeError) -> tuple:
    """gRPC's Retry-After: the `grpc-retry-pushback-ms` trailer that clients' retry policies honour."""
    seconds = retry_after(error)
    return (("grpc-retry-pushback-ms", str(int(seconds * 1000))),) if seconds else ()


async def end_call(context, error: Exception, method: str, redact: Callable[[str], str]) -> None:
    """End the call with `error`'s status, the one mapping of errors to statuses: a ServeError's
    code, message (this machine's paths taken out by `redact`, the state's PathRedactor, as HTTP
    does) and pushback trailer; anything else logged with its traceback and INTERNAL "internal
    error". Raises grpc's AbortError, as context.abort does."""
    if isinstance(error, grpc.aio.AbortError):  # the method ended the call (context.abort): that
        raise error  # status stands (a second abort logged an internal error and grpc's UsageError)
    if isinstance(error, MemoryError):  # the host short of memory: UNAVAILABLE, one WARNING line
        error = host_out_of_memory(error, f"gRPC {method}")
    if isinstance(error, ServeError):
        code, message, trailers = status_code(error), fit_status_message(redact(error.message)), pushback(error)
    else:
        log.error("internal error in gRPC %s", method, exc_info=error)
        code, message, trailers = grpc.StatusCode.INTERNAL, "internal error", ()
    # its frames, and those of an error it came during (a NotServed's: the message's names whole), hold the
    # request's message: let them go now, not at a GC
    error.__traceback__ = error.__context__ = error.__cause__ = None
    await context.abort(code, message, trailers)
