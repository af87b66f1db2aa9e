"""grpc.aio logs a call that ended under its answer at ERROR with a traceback: when the client of
a call goes away while grpc sends the answer (one that waits on the client's flow control, or
is being written), the send fails and grpc's handler wrapper reports "ExecuteBatchError raised
in core" unless it has already seen the client's cancellation, which comes after. Such a record
becomes one DEBUG line naming the method (client_log.py; kept only when the `grpc` loggers log
at DEBUG); grpc's other records, and aclserve's own (a batch that fails on the device), keep
their level and traceback."""
from __future__ import annotations

import logging

from . import client_log

LOGGER = "grpc._cython.cygrpc"
# grpc's class is private (grpc._cython.cygrpc.ExecuteBatchError): matched by its name
ENDED_UNDER_ANSWER = "ExecuteBatchError"


def ended_under_answer(record: logging.LogRecord) -> tuple[str, tuple] | None:
    error = record.exc_info[1] if record.exc_info else None
    if type(error).__name__ != ENDED_UNDER_ANSWER:
        return None
    method = record.getMessage().rpartition("[")[2].rstrip("]")
    return "gRPC %s: the call ended before its answer was sent (the client went away, or the call was cancelled)", \
        (method,)


def install() -> None:
    """Idempotent."""
    client_log.install(LOGGER, ended_under_answer)
