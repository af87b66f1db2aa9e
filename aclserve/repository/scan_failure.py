"""A bug of the scan (layout.scan) on one model's files, kept as text: its type and message, by
which the planner tells one failure from another, and its traceback as logging prints it. The
exception itself held the scan's frames, the ScanResult among them (a cycle), for as long as the
planner kept the scan."""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class ScanFailure:
    what: str  # "RuntimeError: boom"
    traceback: str  # logging's text of it (Formatter.formatException's)

    @classmethod
    def of(cls, error: BaseException) -> ScanFailure:
        return cls(f"{type(error).__qualname__}: {error}", "".join(traceback.format_exception(error)).rstrip("\n"))

    def log(self, logger: logging.Logger, level: int, msg: str, *args) -> None:
        """`logger.log(level, msg, *args, exc_info=the exception)`, the same line: the record
        carries the traceback as its exc_text, which formatters print after the message (and
        logs.JsonFormatter as its "exc")."""
        if logger.isEnabledFor(level):
            filename, lineno, function, _ = logger.findCaller(stacklevel=2)  # (the line that logs it)
            record = logger.makeRecord(logger.name, level, filename, lineno, msg, args, None, function)
            record.exc_text = self.traceback
            logger.handle(record)
