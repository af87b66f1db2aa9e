"""How HTTP spells each ServeError: its status, Retry-After and extra headers, in one table.

The errors themselves (aclserve/errors.py and the server's own in auth.py, body.py, budget.py)
carry only a message; this edge gives them their status, and grpc_status.py gives the same
classes their gRPC codes. A class not listed takes the entry of its nearest listed base, so a
new subclass of Unavailable answers 503 with Retry-After like the others.
"""
from __future__ import annotations

from typing import Mapping, TypeVar

from ..errors import (ExecutionFailed, InvalidInput, NotFound, PayloadTooLarge, ServeError,
                      Unavailable)
from ..repository import ModelLoadFailed
from .auth import Forbidden, Unauthorized
from .body import BodyTimeout, UnsupportedEncoding, UnsupportedTransferCoding

V = TypeVar("V")

HTTP_STATUS: dict[type[ServeError], int] = {
    ServeError: 500,
    InvalidInput: 400,
    ModelLoadFailed: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    BodyTimeout: 408,
    PayloadTooLarge: 413,
    UnsupportedEncoding: 415,
    UnsupportedTransferCoding: 501,
    ExecutionFailed: 500,
    Unavailable: 503,
}
RETRY_AFTER_S: dict[type[ServeError], float] = {Unavailable: 1.0}
HEADERS: dict[type[ServeError], dict[str, str]] = {Unauthorized: {"WWW-Authenticate": 'Bearer realm="aclserve"'}}


def by_class(table: Mapping[type, V], error: BaseException, default: V) -> V:
    """The entry of the error's class or of its nearest base class listed in `table`."""
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    return default


def http_status(error: ServeError) -> int:
    return by_class(HTTP_STATUS, error, 500)


def retry_after(error: ServeError) -> float | None:
    """Seconds a client should wait before retrying (the Retry-After header), or None: the
    error's own when it knows, else its class's."""
    if error.retry_after_s is not None:
        return error.retry_after_s
    return by_class(RETRY_AFTER_S, error, None)


def error_headers(error: ServeError) -> dict[str, str] | None:
    return by_class(HEADERS, error, None)
