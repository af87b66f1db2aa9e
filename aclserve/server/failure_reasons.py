"""The `reason` label of aclserve_request_failure_total: a closed set of values (README, "Every
/metrics family"), each a version's series from its load on (metrics.VersionMetrics).

A reason names the error class that failed the request, spelled here rather than taken from
the class's name, so a renamed class keeps its label and a new subclass takes its nearest
listed base's (a new kind of Overloaded counts as Overloaded), as http_errors.py gives one
its status. Only the errors that can fail a request once its version is found are listed: a
404, 401 or 403 is answered before that (counted_infer's repository lookup, the API token's
middleware), so a ServeError of no listed class is none of a version's failures; should one
come, it counts as InternalError, as HTTP answers a bare ServeError 500.
"""
from __future__ import annotations

from ..errors import (DeviceFailed, DeviceTimeout, ExecutionFailed, InvalidInput, ModelUnavailable, Overloaded,
                      PayloadTooLarge, QueueFull, RequestTimeout, ServeError, ShuttingDown)
from .body import BodyOverBudget, BodyTimeout, UnsupportedEncoding, UnsupportedTransferCoding
from .budget import MemoryExhausted
from .host_memory import HostOutOfMemory
from .http_errors import by_class

CANCELLED = "Cancelled"  # the client went away before its answer (counted_infer)
INTERNAL_ERROR = "InternalError"  # anything that is not a ServeError: a 500 / INTERNAL

REASONS: dict[type[ServeError], str] = {
    InvalidInput: "InvalidInput",
    PayloadTooLarge: "PayloadTooLarge",
    UnsupportedEncoding: "UnsupportedEncoding",
    UnsupportedTransferCoding: "UnsupportedEncoding",  # (a 501: an encoding of the body it does not take)
    BodyTimeout: "BodyTimeout",
    QueueFull: "QueueFull",
    MemoryExhausted: "MemoryExhausted",
    BodyOverBudget: "MemoryExhausted",  # (a MemoryExhausted that closes its connection)
    Overloaded: "Overloaded",
    RequestTimeout: "RequestTimeout",
    ShuttingDown: "ShuttingDown",
    ModelUnavailable: "ModelUnavailable",
    DeviceTimeout: "DeviceTimeout",
    ExecutionFailed: "ExecutionFailed",
    DeviceFailed: "DeviceFailed",  # (an ExecutionFailed: a dashboard alerts on it apart)
    HostOutOfMemory: "HostOutOfMemory",  # (an Unavailable: the host's memory, not the budget's)
}
FAILURE_REASONS: tuple[str, ...] = (*dict.fromkeys(REASONS.values()), CANCELLED, INTERNAL_ERROR)


def failure_reason(error: ServeError) -> str:
    """The `reason` a request failed by `error` is counted under (one of FAILURE_REASONS)."""
    return REASONS.get(type(error)) or by_class(REASONS, error, INTERNAL_ERROR)
