"""Writing trace files, on the tracer's writer thread (one thread: the writes of a file are in order).

A trace_file without log_frequency is one file for the server's life, as Triton's TraceFile is:
each write after the first appends its traces to what this server wrote there (tracing paused
and resumed, a trace_count spent, a model and the global settings sharing the name). The file
is valid JSON at every moment a reader may look: a write copies the file less its closing bytes
(Triton's `]`, the Chrome document's `],"displayTimeUnit":...}`) into a hidden temporary file
beside it (`.NAME.tmp`, which no `NAME.*` pattern matches), adds the new traces and the closing
bytes and renames it over the file. A write costs a copy of the file so far on the disk, and
memory for its new traces only. A file this server did not write, or that was changed or removed
since it did (a previous life's; `aclserve profile --url` removes its file once read), is
replaced, as Triton replaces a file at its first write. Under log_frequency each file (NAME.0,
NAME.1, ...) is written once.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson

from . import chrome, triton
from .records import RequestTrace

log = logging.getLogger(__name__)


@dataclass
class _Written:
    """What this server last wrote to one file: how to find it unchanged, and how to go on."""

    format: str
    identity: tuple[int, int, int]  # (inode, size, mtime_ns) of the file as written
    closing: bytes  # the bytes after its last entry
    entries: bool  # it holds an entry (the next one follows a comma)
    requests: int  # traces in it, and dropped ones (the Chrome document's totals)
    dropped: int
    builder: chrome.Builder | None  # the Chrome tracks it names


# A file grows by appends no further than this: each append copies it (a client allowed to set
# trace settings turned one file to 1 and back 300 times: 681 KB, 100 MB copied; the copies grow
# with the square of the appends). Past it, what would be added is dropped, said once a file.
MAX_FILE_BYTES = 64 << 20


class TraceFiles:
    """The files this server wrote, by absolute path. Writer thread only."""

    def __init__(self):
        self._written: dict[str, _Written] = {}
        self._full: set[str] = set()  # files past MAX_FILE_BYTES (said once)
        self.failed = 0  # writes that failed, each said in an ERROR line (/metrics: read from the loop)

    def write(self, path: str, fmt: str, traces: list[RequestTrace], dropped: int, once: bool) -> None:
        """Write `traces` to `path`: appended to what this server wrote there, or (`once`: a
        log_frequency file; or a file not ours) as the whole file. A failure is logged, one line
        for the disk's errors, leaves the file as it was and is counted (`failed`)."""
        key = os.path.abspath(path)
        before = None if once else self._unchanged(key, fmt)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
        try:
            requests = len(traces) + (before.requests if before else 0)
            dropped_total = dropped + (before.dropped if before else 0)
            # (a copy: a write that fails names no track the file does not hold)
            builder = copy.deepcopy(before.builder) if before else (chrome.Builder() if fmt == "chrome" else None)
            if fmt == "triton":
                entries, closing = orjson.dumps(triton.entries(traces))[1:-1], b"]"
            else:
                entries = orjson.dumps(chrome.events(traces, builder))[1:-1]
                closing = b'],"displayTimeUnit":"ms","otherData":' + \
                    orjson.dumps(chrome.other_data(requests, dropped_total)) + b"}"
            if before is not None and before.identity[1] + len(entries) > MAX_FILE_BYTES:
                if key not in self._full:
                    self._full.add(key)
                    log.warning("trace: %s holds %d bytes, as many as a trace file may: %d trace(s) dropped, and so "
                                "will be what comes for it (name another trace_file)", path, before.identity[1],
                                len(traces))
                return
            folder = os.path.dirname(path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            if before is None:
                with open(tmp, "wb") as f:
                    f.write(b"[" if fmt == "triton" else b'{"traceEvents":[')
                    f.write(entries)
                    f.write(closing)
            else:
                shutil.copyfile(path, tmp)
                with open(tmp, "r+b") as f:
                    f.truncate(before.identity[1] - len(before.closing))
                    f.seek(0, os.SEEK_END)
                    f.write((b"," if before.entries and entries else b"") + entries + closing)
            st = os.stat(tmp)
            os.replace(tmp, path)
            if not once:
                self._written[key] = _Written(fmt, (st.st_ino, st.st_size, st.st_mtime_ns), closing,
                                              bool(entries) or bool(before and before.entries),
                                              requests, dropped_total, builder)
            log.info("trace: %d request(s) %s %s%s", len(traces), "added to" if before else "written to", path,
                     f" ({dropped} dropped: too many waited in memory)" if dropped else "")
        except Exception as e:
            self.failed += 1
            with contextlib.suppress(OSError):  # a part written to a full disk is not left behind
                os.unlink(tmp)
            if isinstance(e, OSError):  # the disk, not a fault here: one line, no traceback
                log.error("trace: could not write %s: %s", path, e.strerror or e)
            else:
                log.exception("trace: could not write %s", path)

    def _unchanged(self, key: str, fmt: str) -> _Written | None:
        """What this server wrote at `key` when the file is still that, in `fmt`; else None (the
        file is written anew)."""
        before = self._written.get(key)
        if before is None or before.format != fmt:
            return None
        try:
            st = os.stat(key)
            with open(key, "rb") as f:
                f.seek(max(st.st_size - len(before.closing), 0))
                tail = f.read()
        except OSError:  # removed since: written anew
            return None
        if (st.st_ino, st.st_size, st.st_mtime_ns) != before.identity or tail != before.closing:
            log.info("trace: %s changed since this server wrote it: written anew", key)
            return None
        return before


def blocked_by(path: Path, indexed: bool) -> Path | None:
    """What on the disk now stops every write of the trace file `path` (with `indexed`, the
    files path.0, path.1, ... beside it): `path` itself, a folder where the file would be; or
    the nearest existing folder of it, which is a file; None when nothing does (folders not
    there yet are made). The API's check of a trace_file and serve's of --trace."""
    if not indexed and path.is_dir():
        return path
    above = path.parent
    while not above.exists() and above.parent != above:
        above = above.parent
    return above if above.exists() and not above.is_dir() else None
