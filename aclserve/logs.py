"""Logging set-up: plain text lines, or one JSON object per line (`log_format: json`).

`configure` (`aclserve serve`'s) has the thread that logs a line format it and queue it; one
writer thread writes the lines to stderr, in order. A StreamHandler wrote in the thread that
logged: with stderr a pipe whose reader stalled (a log shipper, a container's log driver), the
pipe's 64 KiB filled after ~150 request log lines and the event loop blocked in write(), and
with it every request, /v2/health/live and /metrics (a liveness probe would restart a healthy
server). A full queue (QUEUE_LINES) drops lines instead: counted (`lines_dropped()`,
aclserve_log_lines_dropped_total) and said in one line once the writer has caught up.
`stop_queue()` writes out what is queued, before the lines logged after it.

`aclserve serve` also queues what native libraries write to fd 2 (`queue_native`, fed by
cli/stderr_relay.py): each line byte for byte as it was written, or under JSON one object a line
(native_lines.py), dropped and counted as the request log's are once the queue is full; the lines
then go to the real stderr, which configure() is given.

A line stderr refuses (its reader gone: `serve 2>&1 | head -3`, EPIPE; a disk full) is lost, and
counted with the dropped ones (_StderrLines): it was logging's own "--- Logging error ---" to that
same stderr, nowhere, and the count stayed 0 while every line was lost (a tester, t84). A reader
gone is said once where it can be, on stdout when that is another file, and no line is written
to that stderr again; another error is said on stderr once it takes a line again.

A text line starts with its local time and UTC offset (`2026-12-01 08:52:10.120+01:00`, ISO 8601
/ RFC 3339 with a space), so that it is read alike whatever zone the reader is in.

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

import atexit
import datetime
import errno
import logging
import logging.handlers
import os
import queue
import sys
import threading
import time

import orjson

from . import native_lines

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


# Escaped in a text line's message: C0 controls (a tab stays), DEL, C1 controls (U+009B is a
# terminal's CSI, U+0085 a line break to some readers) and the Unicode line and paragraph separators
_CONTROLS = ({c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)] if c != 0x09}
             | {0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


class TextFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # (logging's own is local time without its zone: an hour off, or two, read elsewhere)
        return (datetime.datetime.fromtimestamp(record.created).astimezone()
                .isoformat(sep=" ", timespec="milliseconds"))

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
        if record.exc_info or record.exc_text:  # (exc_text alone: a traceback kept as text, repository/scan_failure.py)
            doc["exc"] = record.exc_text or self.formatException(record.exc_info)
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


# Lines waiting for stderr at most: about 5 MB of request log lines, a second or more of them
# at full speed; past it lines are dropped (counted), not waited for
QUEUE_LINES = 4096
# The request log's lines (a line a request: the flood) may fill the queue but for these, kept for the
# server's own: dropped once the queue was full, the lines saying why and how it stopped were lost to a
# stalled reader that went on within STOP_WAIT_S (a tester)
SERVER_LINES = 256
REQUEST_LOGGER = "aclserve.requests"  # the request log's logger (server/observe.py)
# How long stop_queue() waits for stderr's reader to take the queued lines: a server stopped with a
# stalled reader (SIGTERM, its signals ignored from then on) waited for it for good (a reviewer)
STOP_WAIT_S = 5.0

_queued: "_QueuedStderr | None" = None  # configure()'s, once it ran


def configure(level: str, fmt: str = "text", stream=None) -> bool:
    """logging.basicConfig with a text or JSON handler: like it, a no-op when the root logger
    already has handlers (an embedding program's, or pytest's). The lines go through a bounded
    queue to one writer thread (_QueuedStderr): whoever logs never waits for stderr's reader.
    stop_queue() (and the interpreter's exit, at the latest) writes out what is queued. `stream`:
    the stderr they are written to (sys.stderr's when None; a text stream with a binary `buffer`).
    Whether the queue was set up (False: the no-op)."""
    global _queued
    if logging.getLogger().handlers:
        return False
    _queued = _QueuedStderr(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT), stream)
    logging.basicConfig(level=level.upper(), handlers=[_queued.handler])
    _queued.start()
    atexit.register(stop_queue)  # (run before logging's own exit hook, registered before it)
    return True


def queue_native(data: bytes, line_start: bytes | None = None, continued: bool = False) -> None:
    """Queue `data`, a line (or a piece of one: native_lines.Piece) a native library wrote to fd 2, to be
    written to stderr as it is (under JSON as an object: native_lines.py), in order with the log's lines; dropped
    and counted when the queue holds the request log's share of lines (QUEUE_LINES - SERVER_LINES), as
    a request log line is. Never waits. Written at once in this thread once stop_queue() is done;
    nothing without configure()."""
    if _queued is not None:
        _queued.native(native_lines.Piece(data, line_start, continued))


def stop_queue() -> None:
    """Write out the queued lines (waiting for stderr's reader up to STOP_WAIT_S) and from then on
    write each line in the thread that logs it: a line logged after this (the error the server
    stopped with, an exit hook's) comes after the queued ones. A reader stalled past STOP_WAIT_S:
    the lines left are dropped (counted) and lines go on being queued or dropped, never waited
    for (`writer_stalled`). Idempotent; nothing without configure()."""
    if _queued is not None:
        _queued.stop()


def writer_stalled() -> bool:
    """Whether stop_queue() gave up on stderr's reader: the writer thread is still inside a write,
    and flushing stderr (the interpreter's exit does) would wait for that reader for good."""
    return _queued is not None and _queued.stalled


def lines_dropped() -> int:
    """Log lines (and native libraries' lines, queue_native) dropped so far because the queue was full
    (stderr not read fast enough), and lost because stderr refused them (its reader gone)."""
    return _queued.handler.dropped + _queued.lost.count if _queued is not None else 0


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Formats the line in the thread that logs (as QueueHandler does: the record's arguments as
    they are now) and queues it, or counts it dropped when the queue is full: never waits."""

    def __init__(self, lines: queue.Queue, formatter: logging.Formatter):
        super().__init__(lines)
        self.setFormatter(formatter)
        self.dropped = 0  # (counted in emit(), which Handler.handle runs under the handler's lock)

    def emit(self, record: logging.LogRecord) -> None:
        room = QUEUE_LINES - SERVER_LINES if record.name == REQUEST_LOGGER else QUEUE_LINES
        if self.queue.qsize() >= room:  # dropped before it is formatted: an overloaded server spends nothing on it
            self.dropped += 1
        else:
            super().emit(record)

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:  # filled since emit() looked
            self.dropped += 1

    def enqueue_native(self, piece: native_lines.Piece) -> None:
        """A record of `piece` (a native line or a piece of one) queued, within the request log's room."""
        with self.lock:  # (the count's other writers hold it: emit() runs under it)
            if self.queue.qsize() >= QUEUE_LINES - SERVER_LINES:  # (dropped before a record is made)
                self.dropped += 1
            else:
                self.enqueue(self.native_record(piece))

    def native_record(self, piece: native_lines.Piece) -> logging.LogRecord:
        """`piece`'s record as the writer takes it: its bytes, or under JSON its object formatted."""
        if isinstance(self.formatter, JsonFormatter):
            return self.prepare(native_lines.text_record(piece))
        return native_lines.raw_record(piece.data)


class _Formatted(logging.Formatter):
    """A queued record's line, formatted already by _DroppingQueueHandler."""

    def format(self, record: logging.LogRecord) -> str:
        return record.msg


class _Writer(logging.handlers.QueueListener):
    """The one thread writing the queued lines to stderr, in order. Once it has caught up (the
    queue empty) after lines were dropped, or lost to stderr's refusals while it takes lines
    again, it says how many, in one WARNING line."""

    def __init__(self, lines: queue.Queue, queuing: _DroppingQueueHandler, stream: _StderrLines):
        super().__init__(lines, stream)
        self._queuing = queuing
        self._stream = stream
        self._reported = 0

    def handle(self, record: logging.LogRecord) -> None:
        super().handle(record)
        if self.queue.empty():
            self.report_drops()

    def report_drops(self) -> None:
        if self._stream.lost.failing:  # said once stderr takes a line again, not lost with the rest
            return
        lost, why = self._stream.lost.unreported()
        if lost:
            self._say("%d log line(s) lost: stderr refused them (%s)", (lost, why))
        dropped = self._queuing.dropped
        if dropped > self._reported:
            newly, self._reported = dropped - self._reported, dropped
            self._say("%d log line(s) dropped: stderr was not read as fast as they came "
                      "(the queue holds %d lines, the request log's %d of them at most)",
                      (newly, QUEUE_LINES, QUEUE_LINES - SERVER_LINES))

    def _say(self, message: str, args: tuple) -> None:
        record = logging.LogRecord("aclserve.logs", logging.WARNING, __file__, 0, message, args, None)
        super().handle(self._queuing.prepare(record))

    def stop_within(self, seconds: float) -> bool:
        """QueueListener.stop() within `seconds` (its put_nowait raised on a full queue, and its join
        waited for good): whether the thread has written everything queued before the stop, and ended."""
        deadline = time.monotonic() + seconds
        try:
            self.queue.put(self._sentinel, timeout=seconds)
        except queue.Full:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()


class _QueuedStderr:
    """Owns the queue, its handler (the root logger's), the writer thread and the stderr handler
    it writes with, which stop() makes the root logger's own."""

    def __init__(self, formatter: logging.Formatter, stream=None):
        lines: queue.Queue = queue.Queue(QUEUE_LINES)
        self.formatter = formatter
        self.handler = _DroppingQueueHandler(lines, formatter)
        stream = sys.stderr if stream is None else stream
        self.lost = _LostLines(formatter, _fd_of(stream))
        self.stream = _StderrLines(self.lost, stream)
        self.stream.setFormatter(_Formatted())
        self._writer = _Writer(lines, self.handler, self.stream)
        self._stopped = False
        self._direct = False  # stop() has made the direct handler the root logger's
        self.stalled = False  # stop() gave up on stderr's reader

    def start(self) -> None:
        self._writer.start()

    def native(self, piece: native_lines.Piece) -> None:
        if self._direct:  # (as a logged line is from then on: written in this thread)
            self.stream.handle(self.handler.native_record(piece))
        else:
            self.handler.enqueue_native(piece)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if not self._writer.stop_within(STOP_WAIT_S):  # the queued lines written, then the thread ends
            self.stalled = True  # (the queue's handler stays: lines are queued or dropped, not waited for)
            self.handler.dropped += self.handler.queue.qsize()
            return
        direct = _StderrLines(self.lost, self.stream.stream)
        direct.setFormatter(self.formatter)
        root = logging.getLogger()
        # one assignment, once the writer is done: a line another thread logs meanwhile went to the
        # queue, written below, after the writer's (swapped first, it overtook the queued ones: a reviewer)
        root.handlers = [direct if handler is self.handler else handler for handler in root.handlers]
        self._direct = True
        while True:  # lines queued after the writer's last one (before the handlers were swapped)
            try:
                self.stream.handle(self.handler.queue.get_nowait())
            except queue.Empty:
                break
        self._writer.report_drops()


class _LostLines:
    """The lines stderr refused (to its handlers: the writer's, then stop_queue()'s direct one),
    counted in `count`: `failing` while the last write failed; `gone` once its reader is gone for
    good (EPIPE, stderr closed), after which no line is tried there."""

    def __init__(self, formatter: logging.Formatter, stderr_fd: int):
        self._formatter = formatter
        self._stderr_fd = stderr_fd  # (fd 2, or its duplicate where fd 2 is the native lines' relay)
        self._lock = threading.Lock()  # (the writer thread's handler and the direct one's may race)
        self.count = 0
        self.failing = False
        self.gone = False
        self._why = ""  # the last refusal's reason
        self._reported = 0

    def refused(self, error: BaseException | None) -> None:
        with self._lock:
            self.count += 1
            self.failing = True
            if error is None or self.gone:  # (a line not tried: the reader gone)
                return
            self._why = getattr(error, "strerror", None) or str(error)
            self.gone = isinstance(error, ValueError) or getattr(error, "errno", None) == errno.EPIPE
        if self.gone:
            self._say_on_stdout(f"stderr's reader has gone ({self._why}): log lines are lost from here on, "
                                "counted in aclserve_log_lines_dropped_total")

    def unreported(self) -> tuple[int, str]:
        """The lines refused since the last call, and the last one's reason."""
        with self._lock:
            lost, self._reported = self.count - self._reported, self.count
            return lost, self._why

    def _say_on_stdout(self, message: str) -> None:
        """`message` as a WARNING line on stdout, when stdout is open and not stderr's file."""
        record = logging.LogRecord(__name__, logging.WARNING, __file__, 0, message, (), None)
        try:
            out, err = os.fstat(1), os.fstat(self._stderr_fd)
            if (out.st_dev, out.st_ino) != (err.st_dev, err.st_ino):
                os.write(1, (self._formatter.format(record) + "\n").encode())
        except OSError:  # (stdout closed, or gone too: nowhere left to say it)
            pass


class _StderrLines(logging.StreamHandler):
    """stderr's handler, a line it cannot write counted in `lost` (_LostLines) rather than said in
    logging's "--- Logging error ---" and a traceback to that same stderr; once its reader is gone
    nothing more is written there (nor formatted: the direct handler's lines)."""

    def __init__(self, lost: _LostLines, stream=None):
        super().__init__(stream)
        self.lost = lost
        self._refused_now = False  # (emit runs under the handler's lock)

    def handle(self, record: logging.LogRecord) -> bool:
        if self.lost.gone:
            self.lost.refused(None)
            return False
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        self._refused_now = False
        native = native_lines.raw_bytes(record)
        if native is None:
            super().emit(record)
        else:
            try:  # (its bytes as they came: no terminator added, nothing decoded)
                self.stream.flush()
                self.stream.buffer.write(native)
                self.stream.buffer.flush()
            except Exception:  # noqa: BLE001 - as StreamHandler.emit: handleError sorts it out
                self.handleError(record)
        if not self._refused_now:
            self.lost.failing = False

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError) or (isinstance(error, ValueError) and getattr(self.stream, "closed", False)):
            self._refused_now = True
            self.lost.refused(error)
        else:  # (a line that cannot be formatted: logging's own report)
            super().handleError(record)


def _fd_of(stream) -> int:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # (a stream without one: pytest's capture, say)
        return 2


def writes_json() -> bool:
    """Whether the root logger writes JSON lines (`configure(..., "json")` ran): a line a command
    prints at its end then goes through it, so that a log shipper reads it too."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
