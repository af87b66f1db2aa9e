"""A log record any client can provoke at will, made one DEBUG line.

Libraries log some of what a client does to them at ERROR with a traceback (aiohttp a malformed
request: bad_request_log.py; grpc.aio a call whose client went under its answer: grpc_log.py):
ten lines a client can repeat to flood the log. A filter on the library's logger turns such a
record into one DEBUG line, kept only when that logger logs at DEBUG; its other records keep
their level and traceback."""
from __future__ import annotations

import logging
from typing import Callable

# (format, args) of the DEBUG line a record becomes, or None to leave the record as it is
Describe = Callable[[logging.LogRecord], "tuple[str, tuple] | None"]


class AsDebug(logging.Filter):
    def __init__(self, logger: str, describe: Describe):
        super().__init__()
        self.logger = logger
        self.describe = describe

    def filter(self, record: logging.LogRecord) -> bool:
        line = self.describe(record)
        if line is None:
            return True
        record.msg, record.args = line
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(self.logger).isEnabledFor(logging.DEBUG)


def install(logger: str, describe: Describe) -> None:
    """Idempotent: one filter per (logger, describe)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, AsDebug) and f.describe is describe for f in target.filters):
        target.addFilter(AsDebug(logger, describe))
