"""A line native code wrote to fd 2 (`aclserve serve`'s cli/stderr_relay.py, through logs.queue_native)
as the log record logs.py writes for it: under the text format its bytes as they came, written as
they are; under `log_format: json` its text, which logs.py formats into one JSON object as any line
(written byte for byte, such lines broke a pipeline that parses every stderr line as JSON).

The JSON object's `ts` is when the relay read the line; `logger` is "native": who wrote the line is
not known (grpc core, ONNX Runtime, glibc, a compile's child or ATC, Python's report of a thread's
uncaught exception or a warning all write to that fd); `message` is the line without its newline,
decoded as UTF-8 with each byte that is not UTF-8 escaped (`\\xff`), none dropped; a piece of a line past
the relay's LINE_BYTES is an object of its own (a Piece), each but the last `"continued": true`: a
pipeline joins the messages of the `native` objects that follow one so marked, up to the first
without it (other loggers' lines may come between: they are queued as they are logged). The pieces
were objects with nothing saying they were one line, the first's level absl's letter and the others'
warning. `level` is the severity letter of absl's prefix at the line's start, every piece's,
which grpc core's lines start with (`E1207 13:16:44.606371 6241 chttp2_server.cc:1191] ...`: I, W,
E, F; that exact shape is absl's and glog's), else warning: what native code says unasked on stderr
is mostly a fault or a warning (grpc's "File descriptor limit reached", glibc's complaints, a thread's
traceback, Python's warnings), which info would hide under a level filter and error would make an
alarm of. Native lines are not filtered by the log level, in either format (grpc's own follow
GRPC_VERBOSITY).
"""
from __future__ import annotations

import logging
import re
from typing import NamedTuple

LOGGER = "native"
# the attribute of a text format's record holding the line's bytes, written as they are
_RAW_BYTES = "aclserve_native_bytes"
# absl's (and glog's) prefix: severity, month and day, time, thread id, file:line
_ABSL_PREFIX = re.compile(rb"([IWEF])\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^ \]]+:\d+\] ")
_ABSL_LEVELS = {b"I": logging.INFO, b"W": logging.WARNING, b"E": logging.ERROR, b"F": logging.CRITICAL}


class Piece(NamedTuple):
    """A line native code wrote to fd 2 (its newline included), or a piece of one the relay cut."""
    data: bytes
    line_start: bytes | None = None  # a piece after a line's first: that first piece (its prefix gives the level)
    continued: bool = False  # cut where the line had no newline yet, more of it come: it goes on in the next piece


def raw_record(data: bytes) -> logging.LogRecord:
    """The text format's record of `data` (a line or a piece of one): its bytes, for raw_bytes()."""
    record = logging.LogRecord(LOGGER, logging.INFO, "", 0, "", None, None)
    setattr(record, _RAW_BYTES, data)
    return record


def raw_bytes(record: logging.LogRecord) -> bytes | None:
    """A raw_record's bytes; None for any other record."""
    return getattr(record, _RAW_BYTES, None)


def text_record(piece: Piece) -> logging.LogRecord:
    """The JSON format's record of `piece`: its line's level (absl's letter, else WARNING), its text and
    whether the line goes on in the next piece, made now (the record's time: when the line was read). Its
    message is taken as it is (no % arguments)."""
    data = piece.data
    prefix = _ABSL_PREFIX.match(data if piece.line_start is None else piece.line_start)
    level = _ABSL_LEVELS[prefix[1]] if prefix else logging.WARNING
    text = (data[:-1] if data.endswith(b"\n") else data).decode("utf-8", "backslashreplace")
    record = logging.LogRecord(LOGGER, level, "", 0, text, None, None)
    if piece.continued:
        record.fields = {"continued": True}  # (logs.JsonFormatter puts the fields in the object)
    return record
