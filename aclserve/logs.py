"""Logging set-up: plain text lines, or one JSON object per line (`log_format: json`).

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
        return orjson.dumps(doc, default=str).decode()


def configure(level: str, fmt: str = "text") -> None:
    """logging.basicConfig with a text or JSON handler: like it, a no-op when the root logger
    already has handlers (an embedding program's, or pytest's)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
