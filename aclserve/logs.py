"""Logging set-up: plain text lines, or one JSON object per line (`log_format: json`).

A text line's message has its control characters (C0, DEL, C1) and the Unicode line and
paragraph separators escaped (a newline as \\n, U+0085 as \\x85): a name a client sent, or a
file dropped into the models folder, cannot start a line of its own that passes for the
server's, nor move a terminal's cursor; a traceback follows on lines of its own as usual.

A JSON line carries ts (ISO 8601, UTC, milliseconds), level, logger and message, the
exception's traceback as `exc` when there is one, and the fields a caller passes as
`extra={"fields": {...}}` (the request log's id, model, version, status and durations) at the
top level of the object.
"""
from __future__ import annotations

import datetime
import logging

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


# Escaped in a text line's message: C0 controls (a tab stays), DEL, C1 controls (U+009B is a
# terminal's CSI, U+0085 a line break to some readers) and the Unicode line and paragraph separators
_CONTROLS = ({c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)] if c != 0x09}
             | {0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


class TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
               .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(doc, default=str).decode()
        except orjson.JSONEncodeError:  # a lone surrogate: see surrogates_escaped
            return orjson.dumps({surrogates_escaped(k): surrogates_escaped(v) for k, v in doc.items()},
                                default=lambda v: surrogates_escaped(str(v))).decode()


def surrogates_escaped(value):
    """A string with its lone surrogates written as `\\udcff`, which orjson writes (it refuses
    the surrogates themselves). aiohttp decodes header values as UTF-8 with surrogateescape,
    so a header byte that is not UTF-8 (`User-Agent: \\xff` in the access log at debug) made a
    JSON line fail: "--- Logging error ---" and a traceback on stderr, the line lost (and an
    error answer quoting it, a 500: server/error_responses.error_body)."""
    if type(value) is str:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def configure(level: str, fmt: str = "text") -> None:
    """logging.basicConfig with a text or JSON handler: like it, a no-op when the root logger
    already has handlers (an embedding program's, or pytest's)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def writes_json() -> bool:
    """Whether the root logger writes JSON lines (`configure(..., "json")` ran): a line a command
    prints at its end then goes through it, so that a log shipper reads it too."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
