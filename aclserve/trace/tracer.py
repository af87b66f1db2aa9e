"""The Tracer: which requests are traced (settings, sampling, count), and where traces go.

Event-loop thread only, except the file writes, which run on the tracer's own writer thread on
traces that are complete (nothing writes to a finished trace). Traces wait in memory until their
file is written: every `log_frequency` traces, or when tracing stops for that file (level OFF,
another trace_file, close()). The bounds, all of the tracer's, whatever the names used:
- at most MAX_PENDING traces are held in memory, waiting for their file or for the writer thread
  (a forgotten trace with log_frequency 0 cannot exhaust memory); beyond that new traces are
  counted as dropped (the next file of their name says how many); traces with no trace_file
  (kept for take()) have a MAX_PENDING of their own;
- at most MAX_FILES files are written in all (name.0 ... under log_frequency; said once, the rest
  dropped), so log_frequency 1 at a high trace rate cannot fill the disk;
- at most MAX_NAMES trace_file names are set through the API (a name more is refused, 400);
- while MAX_QUEUED_WRITES files wait for the writer thread, neither log_frequency nor a change of
  trace_file queues more (the traces wait in memory instead, written as the writer catches up).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
from pathlib import Path

from .records import RequestTrace
from .settings import TraceSettings, TraceSettingsError, parse_changes

log = logging.getLogger(__name__)

MAX_PENDING = 50_000  # traces held in memory, waiting for their file or for the writer thread
MAX_FILES = 10_000  # files written, whatever their names
MAX_NAMES = 1_024  # trace_file names set through the API
# a trace_file set through the API, and each folder's or file's name in it, in bytes: within the
# filesystems' 4,096 and 255 (ENAMETOOLONG stopped every write), with room for what the writer
# adds to the name (".<index>" with a log_frequency, ".tmp" while it writes)
MAX_NAME_BYTES = 1_024
MAX_PART_BYTES = 200
MAX_QUEUED_WRITES = 16  # files rendered and written by the writer thread, waiting at once


class _Target:
    """Traces waiting for one (file, format)."""

    __slots__ = ("path", "format", "traces", "index", "dropped", "indexed", "written")

    def __init__(self, path: str, fmt: str):
        self.path, self.format = path, fmt
        self.traces: list[RequestTrace] = []
        self.index = 0
        self.dropped = 0
        self.indexed = False  # log_frequency > 0: files name.0, name.1, ...
        self.written = False  # its file (not indexed) was written once: writing it again adds no file


class Tracer:
    """Owns the settings (global and per model), the sampling counters, the waiting traces and a
    writer thread (started on the first write; close() writes what is left and stops it).

    `trace_dir`: trace_file names set through the API are resolved inside it (absolute paths and
    `..` refused), so a client cannot choose where the server writes; the settings it starts
    with (`settings`: the config file, the command line) may name any path."""

    def __init__(self, settings: TraceSettings | None = None, trace_dir: str = "traces"):
        self._startup = self._global = settings or TraceSettings()  # a global null restores _startup's
        self._overrides: dict[str, dict] = {}  # model -> {field: value} it set itself
        self._models: dict[str, TraceSettings] = {}  # model -> the global settings with its overrides
        self._counters: dict[str, int] = {}
        self._trace_dir = trace_dir
        self._trusted_files: set[str] = set()
        if self._global.file:
            self._trusted_files.add(self._global.file)
        self._targets: dict[tuple[str, str], _Target] = {}
        self._names: set[str] = set()  # trace_file names set through the API
        self._left: dict[tuple[str, str], None] = {}  # targets tracing left, written as the writer has room
        self._waiting = 0  # traces in the targets that have a file
        self._files = 0  # files written or being written
        self._next_id = 1
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._writes: list[tuple[concurrent.futures.Future, int]] = []  # (write, its traces)
        self.on_change = None  # called after settings change (the server re-checks its hooks)

    # -- settings ---------------------------------------------------------------------------------
    def settings(self, model: str | None = None) -> TraceSettings:
        return self._models.get(model, self._global) if model else self._global

    def log_startup(self) -> None:
        """Start-up settings that trace nothing, said once: the config file's trace section can
        set the level without a file or a file without the level (--trace sets both; the
        other flags are checked where they are read, cli/serve.py)."""
        start = self._startup
        if start.level == "OFF":
            if start.file:
                log.warning("trace.file is %s but trace.level is OFF: nothing is traced until trace.level is "
                            "TIMESTAMPS or the trace API turns tracing on", start.file)
        elif not start.file:
            log.warning("trace.level is %s but no trace.file is set: traces are kept in memory and never "
                        "written; set trace.file (or --trace FILE)", start.level)
        elif start.count == 0:
            log.warning("trace.count is 0: no request is traced until the trace API sets another count")

    @property
    def any_on(self) -> bool:
        return self._global.on or any(s.on for s in self._models.values())

    def update(self, changes: dict, model: str | None = None) -> TraceSettings:
        """Apply Triton's trace-setting JSON; returns the settings now in force (the model's,
        or the global ones). Raises TraceSettingsError (the message names the setting). A model
        keeps only the settings it set itself (a null clears one, no settings clear them all);
        the others follow the global settings, now and as they change, as in Triton."""
        if model:
            fields = parse_changes(changes)  # (also refuses what is not a JSON object)
            own = {} if not changes else {**self._overrides.get(model, {}), **fields}
            own = {name: value for name, value in own.items() if value is not None}
            new = dataclasses.replace(self._global, **own)
        else:
            new = self._global.updated(changes, self._startup)
        if new.file and new.file not in self._trusted_files:
            self._resolve(new.file)  # refuse a bad name before anything changes
            old = self._models.get(model, self._global) if model else self._global
            # checked when the file written changes: another name, or the name itself once
            # log_frequency stops writing name.N beside it (a name in force stays, whatever the disk says)
            if new.file != old.file or (new.log_frequency == 0 and old.log_frequency > 0):
                self._check_writable(new.file, new.log_frequency > 0)
            if new.file not in self._names:
                if len(self._names) >= MAX_NAMES:
                    raise TraceSettingsError(f"trace_file: this server has taken {MAX_NAMES} trace_file names "
                                             f"already; use one of them again")
                self._names.add(new.file)
        if model:
            before = self._models.get(model, self._global)
            self._set_own(model, own)
        else:
            before = self._global
            self._set_global(new)
        self._settled(before, new)
        return new

    def _set_global(self, settings: TraceSettings) -> None:
        """New global settings, which every model follows but for the settings it set itself."""
        self._global = settings
        for name, own in self._overrides.items():
            self._models[name] = dataclasses.replace(settings, **own)

    def _set_own(self, model: str, own: dict) -> None:
        """The settings `model` set itself (none: it follows the global ones entirely)."""
        if own:
            self._overrides[model] = own
            self._models[model] = dataclasses.replace(self._global, **own)
        else:
            self._overrides.pop(model, None)
            self._models.pop(model, None)

    def _settled(self, before: TraceSettings | None, after: TraceSettings) -> None:
        """Write what waited for the old file when tracing to it stopped or moved (once the
        writer thread has room: `_catch_up`)."""
        if before is not None and before.file and (not after.on or (before.file, before.format)
                                                   != (after.file, after.format)):
            key = (before.file, before.format)
            if key in self._targets and not self._still_used(key):
                self._left[key] = None
        self._catch_up()
        if self.on_change is not None:
            self.on_change()

    def _still_used(self, key: tuple[str, str]) -> bool:
        return any(s.on and (s.file, s.format) == key for s in (self._global, *self._models.values()))

    def _catch_up(self) -> None:
        """Write the files tracing left (oldest first) while the writer thread has room: so
        changes of trace_file faster than the writer writes queue no more than
        MAX_QUEUED_WRITES files; their traces wait meanwhile (counted in MAX_PENDING)."""
        while self._left and self._queued_writes() < MAX_QUEUED_WRITES:
            key = next(iter(self._left))
            del self._left[key]
            if not self._still_used(key):  # (a name used again writes as its log_frequency says)
                self._flush(self._targets.get(key))

    def _resolve(self, name: str) -> str:
        if name in self._trusted_files:
            return name
        path = Path(name)
        if path.is_absolute():  # (not quoted: shown to a client, it would lose its folders, redact.py)
            raise TraceSettingsError("trace_file: must be a relative name inside the trace folder, not an absolute path")
        if ".." in path.parts or not path.parts:
            raise TraceSettingsError(f"trace_file: must be a relative name inside the trace folder, got {name!r}")
        if len(name.encode()) > MAX_NAME_BYTES or any(len(part.encode()) > MAX_PART_BYTES for part in path.parts):
            raise TraceSettingsError(f"trace_file: longer than {MAX_NAME_BYTES} bytes, or a folder or file name in it "
                                     f"longer than {MAX_PART_BYTES} (UTF-8)")
        return str(Path(self._trace_dir) / path)

    def _check_writable(self, name: str, indexed: bool) -> None:
        """Refuse a name set through the API that what is on the disk now would stop every write
        of (each was an ERROR with a traceback, the traces lost): a folder of it that is a file,
        or the name a folder when it is the file written (`indexed`, log_frequency > 0, writes
        name.0, name.1, ... beside it). Read when it is set, not at each write (the request path)."""
        path = Path(self._trace_dir) / name
        try:
            blocker = blocked_by(path, indexed)
        except OSError as e:  # a folder of it unreadable, say
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: {e.strerror or e}") from None
        if blocker == path:
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: it is a folder")
        if blocker is not None:
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: {blocker.name!r} is a file, not a folder")
        folder = path.parent  # (indexed: name.0, name.1, ... are written beside the name)
        try:  # made now: one that could not be (trace_dir unwritable) lost every trace, said only in the log
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: its folder cannot be made "
                                     f"({e.strerror or e}; see trace_dir in the config)") from None
        if not os.access(folder, os.W_OK):
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: its folder is not writable "
                                     "(see trace_dir in the config)")

    # -- the hot path (a sampled request only) --------------------------------------------------------
    def start(self, model: str, version: str, protocol: str, arrival_ns: int) -> RequestTrace | None:
        """A RequestTrace when this request is to be traced, else None."""
        settings = self._models.get(model, self._global)
        if not settings.on:
            return None
        seen = self._counters.get(model, 0) + 1
        if seen < settings.rate:
            self._counters[model] = seen
            return None
        self._counters[model] = 0
        if settings.count > 0:  # as Triton: a model with settings of its own counts down its own copy
            own = self._overrides.get(model)
            if own is None:  # it follows the global settings entirely
                self._set_global(dataclasses.replace(self._global, count=settings.count - 1))
            elif "count" in own:
                self._set_own(model, {**own, "count": settings.count - 1})
            else:  # a copy of the global count, refreshed when the global settings change
                self._models[model] = dataclasses.replace(settings, count=settings.count - 1)
        return RequestTrace(model, version, protocol, arrival_ns)

    def finish(self, trace: RequestTrace) -> None:
        """A traced request was answered: number it and queue it for its file."""
        trace.id = self._next_id
        self._next_id += 1
        settings = self._models.get(trace.model, self._global)
        key = (settings.file, settings.format)
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target(*key)
        target.indexed = settings.log_frequency > 0
        # Memory-only traces (no trace_file) leave only by take() (aclserve profile): bounded on
        # their own, as nothing on a server takes them, and they must not starve the files
        full = (len(target.traces) >= MAX_PENDING if not target.path
                else self._waiting + self._queued_traces() >= MAX_PENDING)
        if full:
            target.dropped += 1
            return
        target.traces.append(trace)
        if target.path:
            self._waiting += 1
        self._catch_up()
        if settings.file and settings.log_frequency and len(target.traces) >= settings.log_frequency:
            if self._queued_writes() < MAX_QUEUED_WRITES:
                self._flush(target)  # (else the writer is behind: the traces wait, MAX_PENDING at most)

    # -- output -----------------------------------------------------------------------------------
    def take(self, file: str = "", fmt: str = "chrome") -> list[RequestTrace]:
        """The traces waiting for (file, format), removed (for in-process use: `aclserve profile`)."""
        target = self._targets.get((file, fmt))
        if target is None:
            return []
        traces, target.traces = target.traces, []
        if target.path:
            self._waiting -= len(traces)
        return traces

    def _flush(self, target: _Target | None) -> None:
        if target is None or not target.path or not (target.traces or target.dropped):
            return
        traces, dropped = target.traces, target.dropped
        target.traces, target.dropped = [], 0
        self._waiting -= len(traces)
        self._left.pop((target.path, target.format), None)  # (flush() at close writes it now)
        new_file = target.indexed or not target.written
        if new_file and self._files >= MAX_FILES:
            if self._files == MAX_FILES:
                log.warning("trace: %d trace files written; further traces are dropped (restart the server to "
                            "trace again)", MAX_FILES)
                self._files += 1
            return
        self._files += new_file
        target.written = target.written or not target.indexed
        path = self._resolve(target.path)
        if target.indexed:  # log_frequency files: name.0, name.1, ... (a file name new to the tracer starts at 0)
            path = f"{path}.{target.index}"
            target.index += 1
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        write = self._writer.submit(_write, path, target.format, traces, dropped)
        self._writes.append((write, len(traces)))
        write.add_done_callback(self._catch_up_later())  # its end makes room for names left (_left)

    def _catch_up_later(self):
        """A done-callback (writer thread) that runs _catch_up on the event loop, when there is
        one (in-process use without a loop writes what is left at close())."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return lambda _write: None

        def wake(_write) -> None:
            if not self._left:  # (read from the writer thread: at worst one call too many)
                return
            try:
                loop.call_soon_threadsafe(self._catch_up)
            except RuntimeError:  # the loop closed first: close() wrote what was left
                pass
        return wake

    def _queued_writes(self) -> int:
        """Files waiting for the writer thread (the written ones forgotten)."""
        self._writes = [(f, n) for f, n in self._writes if not f.done()]
        return len(self._writes)

    def _queued_traces(self) -> int:
        """Traces in the files waiting for the writer thread."""
        self._queued_writes()
        return sum(n for _, n in self._writes)

    def flush(self) -> list[concurrent.futures.Future]:
        """Write every waiting trace now (as tracing stopping would); returns the pending writes."""
        for target in list(self._targets.values()):
            self._flush(target)
        return [f for f, _ in self._writes]

    def close(self) -> None:
        """Write what waits and stop the writer thread (blocking). Safe twice."""
        self.flush()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)


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


def _write(path: str, fmt: str, traces: list[RequestTrace], dropped: int) -> None:
    from . import chrome, triton
    tmp = f"{path}.tmp"
    try:
        body = triton.render(traces) if fmt == "triton" else chrome.render(traces, dropped)
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        log.info("trace: %d request(s) written to %s%s", len(traces), path,
                 f" ({dropped} dropped: more than {MAX_PENDING} waited)" if dropped else "")
    except Exception as e:
        with contextlib.suppress(OSError):  # a part written to a full disk is not left behind
            os.unlink(tmp)
        if isinstance(e, OSError):  # the disk, not a fault here: one line, no traceback
            log.error("trace: could not write %s: %s", path, e.strerror or e)
        else:
            log.exception("trace: could not write %s", path)
