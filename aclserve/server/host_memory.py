"""A MemoryError while serving a request: the host short of memory (or the process's address space,
RLIMIT_AS, used up), not a fault of the server's. It was answered `HTTP 500: internal error`, with
a traceback in the log (a 27 MB PNG to an image model under an address-space limit near the
server's size: `body += chunk` in body.py, or Pillow's decode; tester t87). It is answered as the
memory budget's refusals are, 503 / UNAVAILABLE with Retry-After (the request may pass once memory
is back), in a message saying so, and logged in one WARNING line naming where memory ran out,
without the traceback.

`HostOutOfMemory` is made from the MemoryError where a request's outcome is counted (infer_pipeline's
counted_infer) and at each transport's edge for the rest (error_responses.py, direct.py,
grpc_status.py, grpc_service.py's streams); the MemoryError's traceback is let go there, whose
frames hold the request's buffers.
"""
from __future__ import annotations

import logging
import os
import traceback

from ..errors import Unavailable

log = logging.getLogger(__name__)

MESSAGE = ("the server ran out of memory serving this request (its host's, or its address-space limit): "
           "try again later, or send a smaller request")


class HostOutOfMemory(Unavailable):
    """A request failed for want of host memory (a MemoryError while it was served)."""


def host_out_of_memory(error: MemoryError, what: str) -> HostOutOfMemory:
    """The refusal of the request `error` failed (`what`: how the log line names the request),
    said in one WARNING line."""
    where = _where(error)
    detail = str(error).strip()
    log.warning("host short of memory: %s was refused 503 / UNAVAILABLE (MemoryError at %s%s)", what, where,
                f": {detail}" if detail else "")
    error.__traceback__ = None  # (its frames hold the request: a body, the pictures' pixels)
    return HostOutOfMemory(MESSAGE)


def _where(error: BaseException) -> str:
    """The place the traceback ends, `folder/file.py:line` (what ran out: the body's read, a decode)."""
    last = None
    for last in traceback.walk_tb(error.__traceback__):
        pass
    if last is None:
        return "an unknown place"
    frame, line = last
    path = frame.f_code.co_filename
    return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}:{line}"
