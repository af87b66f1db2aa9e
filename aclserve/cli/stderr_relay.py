"""`aclserve serve`'s fd 2: a pipe of its own that a relay thread drains at once into the log's
bounded queue (logs.queue_native); the real stderr kept on a duplicate, where the log's writer
thread writes.

Native code writes to fd 2 itself, past logs.py's queue: grpc core (its "File descriptor limit
reached", GRPC_VERBOSITY and GRPC_TRACE lines), ONNX Runtime, glibc, a compile's child and ATC, and
Python's own lines on sys.stderr (a thread's uncaught exception, a warning). With stderr a pipe whose
reader stalled such a write blocked the thread that made it: one of grpc's event engine threads, and
every gRPC infer got DEADLINE_EXCEEDED while HTTP served on (a tester, t87). Now that pipe is read
as it fills: each line, whole up to LINE_BYTES (a longer one in pieces of it, cut between UTF-8
characters once more of the line has come, each but the last marked as going on, all given the
line's start for their level: native_lines.Piece), is queued, in order with aclserve's own lines, or
dropped and counted (aclserve_log_lines_dropped_total) once the queue holds the request log's share;
no write to fd 2 waits for stderr's reader. A queued line is written byte for byte, or under `log_format: json` as
one JSON object (native_lines.py).

Owner and close path: run_serve opens the relay (`relay_for_logs`) as it sets logging up and closes
it once the server has stopped, before logs.stop_queue(). close() puts the real stderr back on fd 2
(a line written from then on goes there directly, as the log's own do once stop_queue() is done),
then the relay thread reads what the pipe still holds, the last unfinished line too (a line's last
piece, not marked as going on: nothing more of it will come), onto the queue
that stop_queue() writes out, and ends; the pipe is closed (a child still holding its writing end
gets EPIPE). The duplicate stays open for the process's life: the log's writer and faulthandler
write to it. A process that dies by a signal ends the relay with it: faulthandler, when enabled
(PYTHONFAULTHANDLER, -X faulthandler), writes its dump to the duplicate from its signal handler;
Python's last traceback is printed after close(), on the real fd 2; what native code wrote just
before such a death (glibc's "malloc(): corrupted ..." before its abort, C++'s "terminate called
...") is lost when the relay had not read it yet.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import select
import sys
import threading

from .. import logs

# A native line queued whole up to this many bytes besides its newline; a longer one goes in pieces of
# it: the queue's QUEUE_LINES lines of native output hold 32 MiB at most (a line of just this many and
# its newline came out as a piece said to go on and a piece of the newline alone, an empty message)
LINE_BYTES = 8192
_READ_BYTES = 1 << 16  # (a pipe's default capacity)


def relay_for_logs(level: str, fmt: str) -> "StderrRelay | None":
    """logs.configure(level, fmt) writing to a duplicate of stderr, with fd 2 a pipe drained into
    the log's queue by a relay thread: the relay, for its owner to close() once the server has
    stopped. None where logging was set up already (an embedding program's handlers: fd 2 is left
    as it is), or fd 2 stayed as it is because no descriptor was left for the relay (said in a warning)."""
    real_fd = os.dup(2)  # (never closed: see the module's doc)
    real = os.fdopen(real_fd, "w", encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                     errors="backslashreplace", closefd=False)
    if not logs.configure(level, fmt, stream=real):
        os.close(real_fd)
        return None
    try:
        return StderrRelay(real_fd)
    except OSError as e:  # (EMFILE: a descriptor limit so low that the start fails further on anyway)
        logging.getLogger(__name__).warning("native libraries' lines go to stderr directly, where a reader that "
                                            "stalls stalls their threads: no pipe for them (%s)", e.strerror or e)
        return None


class StderrRelay:
    """fd 2 on a pipe whose reading end a daemon thread drains into logs.queue_native, from its
    creation to close(). `real_fd`: the real stderr's duplicate (its owner keeps it open)."""

    def __init__(self, real_fd: int):
        self._real_fd = real_fd
        self._read_end, write_end = os.pipe()
        try:
            self._wake = os.eventfd(0, os.EFD_CLOEXEC)  # close()'s word to the thread
        except OSError:
            os.close(self._read_end)
            os.close(write_end)
            raise
        os.dup2(write_end, 2)  # (inheritable: a child's stderr is the relay's pipe too)
        os.close(write_end)
        if faulthandler.is_enabled():  # its dump comes from a signal handler: no relay runs by then
            faulthandler.enable(file=real_fd, all_threads=True)
        self._unfinished = bytearray()  # the start of a line whose end has not come
        self._line_start: bytes | None = None  # the first piece of the line being cut in pieces, once queued
        self._closed = False
        self._thread = threading.Thread(target=self._relay, name="stderr-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The real stderr back on fd 2, what the pipe holds queued (the thread's last work), the
        pipe closed. Idempotent; never waits for stderr's reader (the queue takes or drops)."""
        if self._closed:
            return
        self._closed = True
        os.dup2(self._real_fd, 2)
        os.eventfd_write(self._wake, 1)
        self._thread.join()
        os.close(self._read_end)
        os.close(self._wake)

    def _relay(self) -> None:
        poller = select.poll()
        poller.register(self._read_end, select.POLLIN)
        poller.register(self._wake, select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._wake in ready or not self._took(os.read(self._read_end, _READ_BYTES)):
                    break  # close() said so, or no writer is left
            os.set_blocking(self._read_end, False)  # what the pipe holds now, not what a child writes later
            while self._took(self._read_now()):
                pass
            if self._unfinished:  # (LINE_BYTES at most: more of it was cut)
                logs.queue_native(bytes(self._unfinished), self._line_start)
        except BaseException:  # fd 2 the real stderr again rather than a pipe nobody reads, then said
            os.dup2(self._real_fd, 2)
            raise

    def _read_now(self) -> bytes:
        try:
            return os.read(self._read_end, _READ_BYTES)
        except BlockingIOError:
            return b""

    def _took(self, chunk: bytes) -> bool:
        """`chunk`'s lines queued, its unfinished end kept for the next; False for no bytes. A line is cut
        once more of it has come than LINE_BYTES: a piece cut goes on in the next, for sure."""
        if not chunk:
            return False
        pending = self._unfinished
        pending += chunk
        start = 0
        while True:
            end = pending.find(b"\n", start, start + LINE_BYTES + 1)
            if end >= 0:
                logs.queue_native(bytes(pending[start:end + 1]), self._line_start)
                self._line_start = None
                start = end + 1
            elif len(pending) - start > LINE_BYTES:
                cut = _piece_end(pending, start + LINE_BYTES)
                piece = bytes(pending[start:cut])
                logs.queue_native(piece, self._line_start, continued=True)
                self._line_start = self._line_start or piece
                start = cut
            else:
                break
        del pending[:start]
        return True


def _piece_end(pending: bytearray, end: int) -> int:
    """`end`, or where the UTF-8 character that `end` would split starts: a piece that ends within one
    had its bytes escaped as bytes that are no UTF-8 in both pieces' JSON objects (a text line's pieces
    are written one after the other: the same bytes come out). Only the piece's last 3 bytes are read."""
    for lead in range(end - 1, end - 4, -1):
        byte = pending[lead]
        if byte < 0x80:  # ASCII: no character goes on past `end`
            return end
        if byte >= 0xC0:  # a character's first byte, and its length from it
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return lead if end - lead < length else end
    return end  # (3 continuation bytes: no character of 4 bytes or less is split)
