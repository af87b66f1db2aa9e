"""aiohttp's server logs a malformed request it answers 400 itself (a bad header, a control
character in the path) at ERROR with its traceback: ten lines for a client's mistake, which
any client can repeat to flood the log. Such a record becomes one DEBUG line naming the error
(kept only when `aiohttp.server` logs at DEBUG, `log_level: debug`); the server's own errors
there keep their level and traceback."""
from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

LOGGER = "aiohttp.server"
MAX_MESSAGE = 200  # the error quotes the client's bytes


class BadRequestsAsDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        text = " ".join(str(error.message).split())[:MAX_MESSAGE]
        record.msg, record.args = "%s: %s %s %s", (record.getMessage(), error.code, type(error).__name__, text)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(LOGGER).isEnabledFor(logging.DEBUG)


def install() -> None:
    """Idempotent: one filter on aiohttp's server logger."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, BadRequestsAsDebug) for f in logger.filters):
        logger.addFilter(BadRequestsAsDebug())
