"""aiohttp's server logs a malformed request it answers 400 itself (a bad header, a control
character in the path) at ERROR with its traceback: ten lines for a client's mistake, which
any client can repeat to flood the log. Such a record becomes one DEBUG line naming the error
(kept only when `aiohttp.server` logs at DEBUG, `log_level: debug`); the server's own errors
there keep their level and traceback."""
from __future__ import annotations

import logging
import re

from aiohttp.http_exceptions import HttpProcessingError

from . import client_log

LOGGER = "aiohttp.server"
MAX_MESSAGE = 200
# The error quotes the client's bytes (b'...'): an Authorization header's may be among them,
# whole, folded or as its value alone (a line too long), so none are logged: the API token,
# say, never is; the error's words say what was wrong
CLIENT_BYTES = re.compile(r"""b'(?:[^'\\]|\\.)*'?|b"(?:[^"\\]|\\.)*"?""")
# ... and, quoted otherwise, what follows a credentials header's name or scheme
_CREDENTIALS = re.compile(r"(?i)((?:proxy-)?authorization\s*:\s*|\b(?:bearer|basic)\s+)[^\r\n'\"]*")


def bad_request(record: logging.LogRecord) -> tuple[str, tuple] | None:
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, HttpProcessingError):
        return None
    text = CLIENT_BYTES.sub("<the client's bytes>", str(error.message))
    text = _CREDENTIALS.sub(r"\1<hidden>", text)
    text = " ".join(text.split())[:MAX_MESSAGE]
    return "%s: %s %s %s", (record.getMessage(), error.code, type(error).__name__, text)


def install() -> None:
    """Idempotent: one filter on aiohttp's server logger (client_log.py)."""
    client_log.install(LOGGER, bad_request)
