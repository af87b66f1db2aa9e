"""The Tracer: which requests are traced (settings, sampling, count), and where traces go.

Event-loop thread only, except the file writes, which run on the tracer's own writer thread on
traces that are complete (nothing writes to a finished trace). A trace goes where the settings
said when it was sampled. Traces wait in memory until their file is written: every
`log_frequency` traces, or once tracing stops for that file (level OFF, another trace_file, the
trace_count spent) and its last trace sampled is in, or at close(). A later write to a name
appends to its file (files.py). Over the API, settings that would trace with no trace_file are
refused (Triton's "trace file name is not given"): only the start-up settings keep traces in
memory, for take() (`aclserve profile` in-process). The bounds, all of the tracer's, whatever
the names used:
- at most MAX_PENDING traces are held in memory, waiting for their file or for the writer thread
  (a forgotten trace with log_frequency 0 cannot exhaust memory); beyond that new traces are
  counted as dropped (the next file of their name says how many); traces with no trace_file
  (kept for take()) have a MAX_PENDING of their own;
- at most MAX_FILES files are written in all (name.0 ... under log_frequency; said once, the rest
  dropped), so log_frequency 1 at a high trace rate cannot fill the disk;
- at most MAX_NAMES trace_file names are set through the API (a name more is refused, 400: names.py);
- while MAX_QUEUED_WRITES files wait for the writer thread, neither log_frequency nor a change of
  trace_file queues more (the traces wait in memory instead, written as the writer catches up).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging

from .files import TraceFiles
from .names import TraceNames
from .records import RequestTrace
from .settings import TraceSettings, TraceSettingsError, parse_changes

log = logging.getLogger(__name__)

MAX_PENDING = 50_000  # traces held in memory, waiting for their file or for the writer thread
MAX_FILES = 10_000  # files written, whatever their names
MAX_QUEUED_WRITES = 16  # files rendered and written by the writer thread, waiting at once


class _Target:
    """Traces going to one (trace_file, format): waiting for their file, or still in flight."""

    __slots__ = ("name", "format", "path", "traces", "index", "dropped", "frequency", "written", "in_flight")

    def __init__(self, name: str, fmt: str, path: str):
        self.name, self.format, self.path = name, fmt, path  # path: where it is written ("" = memory only)
        self.traces: list[RequestTrace] = []
        self.index = 0
        self.dropped = 0
        self.frequency = 0  # log_frequency (> 0: files name.0, name.1, ...), as its last trace sampled said
        self.written = False  # its file (not indexed) was written once: writing it again adds no file
        self.in_flight = 0  # traces sampled for it, not finished yet

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.format


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
        self._names = TraceNames(trace_dir, self._global.file)
        self._targets: dict[tuple[str, str], _Target] = {}
        self._left: dict[tuple[str, str], None] = {}  # targets tracing left, written as the writer has room
        self._waiting = 0  # traces in the targets that have a file
        self._files = 0  # files written or being written
        self._next_id = 1
        self._disk = TraceFiles()  # (the writer thread's)
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._writes: list[tuple[concurrent.futures.Future, int]] = []  # (write, its traces)
        self.on_change = None  # called after settings change (the server re-checks its hooks)

    # -- settings ---------------------------------------------------------------------------------
    def settings(self, model: str | None = None) -> TraceSettings:
        return self._models.get(model, self._global) if model else self._global

    @property
    def operator_file(self) -> str:
        """The start-up settings' trace file (--trace, the config file's): any path."""
        return self._names.operator_file

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
    def files_failed(self) -> int:
        """Trace file writes that failed (the disk full, a folder in the way): their traces lost."""
        return self._disk.failed

    @property
    def any_on(self) -> bool:
        return self._global.on or any(s.on for s in self._models.values())

    def update(self, changes: dict, model: str | None = None) -> TraceSettings:
        """Apply Triton's trace-setting JSON; returns the settings now in force (the model's,
        or the global ones). Raises TraceSettingsError (the message names the setting), and then
        changes nothing. A model keeps only the settings it set itself (a null clears one, no
        settings clear them all); the others follow the global settings, now and as they
        change, as in Triton."""
        if model:
            fields = parse_changes(changes)  # (also refuses what is not a JSON object)
            own = {} if not changes else {**self._overrides.get(model, {}), **fields}
            own = {name: value for name, value in own.items() if value is not None}
            new = dataclasses.replace(self._global, **own)
            before = self._models.get(model, self._global)
            followers = []
            others = [("the global settings", self._global)] + [
                (f"model {name!r}", settings) for name, settings in self._models.items() if name != model]
        else:
            new = self._global.updated(changes, self._startup)
            before = self._global
            followers = [(name, self._models[name], dataclasses.replace(new, **own))
                         for name, own in self._overrides.items()]
            others = [(f"model {name!r}", settings) for name, _, settings in followers]
        self._check(new, before, followers, others)
        self._names.taken(new)
        if model:
            self._set_own(model, own)
        else:
            self._set_global(new)
        self._settled(before, new)
        return new

    def _check(self, new: TraceSettings, before: TraceSettings, followers: list, others: list) -> None:
        """Refuse `new` (replacing `before`; `followers`: (model, before, after) of the models
        that follow a global update; `others`: (whose, settings) of the rest in force after it)
        when it traces with no trace_file (kept in memory, never written: Triton refuses it too,
        in its words), names a file the API may not or the disk cannot take, or would put two
        formats into one file."""
        if new.level != "OFF" and not new.file and new not in (before, self._startup):  # (null restores the start)
            raise TraceSettingsError(f"trace_file: trace file name is not given (trace_level {new.level} writes "
                                     "its traces to a trace_file)")
        for name, old, after in followers:  # (a model that set its trace_level or its trace_file itself)
            if after.level != "OFF" and not after.file and (old.level == "OFF" or old.file):
                raise TraceSettingsError(f"trace_file: trace file name is not given (model {name!r} would trace, "
                                         f"its trace_level {after.level}, with no trace_file)")
        self._names.check(new, before)
        tracing = [(whose, settings) for whose, settings in [("", new), *others]
                   if settings.file and settings.level != "OFF"]
        self._names.check_formats(tracing)

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
        """Write what waited for the old file when tracing to it stopped or moved."""
        if before is not None and before.file and (not after.on or (before.file, before.format)
                                                   != (after.file, after.format)):
            self._left_by_all(self._targets.get((before.file, before.format)))
        self._catch_up()
        if self.on_change is not None:
            self.on_change()

    def _left_by_all(self, target: _Target | None) -> None:
        """Write `target`'s file when no settings trace to it any more and its last trace sampled
        is in (else its finish() comes back here), once the writer thread has room: `_catch_up`."""
        if target is not None and target.path and not target.in_flight and (target.traces or target.dropped) \
                and not self._still_used(target.key):
            self._left[target.key] = None

    def _still_used(self, key: tuple[str, str]) -> bool:
        return any(s.on and (s.file, s.format) == key for s in (self._global, *self._models.values()))

    def _catch_up(self) -> None:
        """Write the files tracing left (oldest first) while the writer thread has room: so
        changes of trace_file faster than the writer writes queue no more than
        MAX_QUEUED_WRITES files; their traces wait meanwhile (counted in MAX_PENDING)."""
        while self._left and self._queued_writes() < MAX_QUEUED_WRITES:
            key = next(iter(self._left))
            del self._left[key]
            target = self._targets.get(key)
            # (a name used again writes as its log_frequency says; one still in flight when its last is in)
            if not target.in_flight and not self._still_used(key):
                self._flush(target)

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
            if own is None:  # it follows the global settings entirely: (a countdown is no settings
                # change: the copies of the models with settings of their own stay as they are)
                self._global = dataclasses.replace(self._global, count=settings.count - 1)
            elif "count" in own:
                self._set_own(model, {**own, "count": settings.count - 1})
            else:  # a copy of the global count, refreshed when the global settings change
                self._models[model] = dataclasses.replace(settings, count=settings.count - 1)
        target = self._targets.get((settings.file, settings.format))
        if target is None:
            target = self._target(settings)
        target.frequency = settings.log_frequency
        target.in_flight += 1
        trace = RequestTrace(model, version, protocol, arrival_ns)
        trace.target = target
        return trace

    def _target(self, settings: TraceSettings) -> _Target:
        key = (settings.file, settings.format)
        path = self._names.path(settings.file) if settings.file else ""
        target = self._targets[key] = _Target(*key, path)
        if path:
            self._names.took(path, settings.format)  # (the format the file holds from now on)
        return target

    def finish(self, trace: RequestTrace) -> None:
        """A traced request was answered: number it and queue it for its file (written now when
        it completes a log_frequency, or when it was the last one in of a file tracing left)."""
        trace.id = self._next_id
        self._next_id += 1
        target = trace.target
        if target is None:  # (not one start() made)
            settings = self._models.get(trace.model, self._global)
            target = trace.target = self._targets.get((settings.file, settings.format)) or self._target(settings)
            target.frequency = settings.log_frequency
        else:
            target.in_flight -= 1
        # Memory-only traces (no trace_file) leave only by take() (aclserve profile): bounded on
        # their own, as nothing on a server takes them, and they must not starve the files
        full = (len(target.traces) >= MAX_PENDING if not target.path
                else self._waiting + self._queued_traces() >= MAX_PENDING)
        if full:
            target.dropped += 1
        else:
            target.traces.append(trace)
            if target.path:
                self._waiting += 1
        self._catch_up()
        if target.path and target.frequency and len(target.traces) >= target.frequency:
            if self._queued_writes() < MAX_QUEUED_WRITES:
                self._flush(target)  # (else the writer is behind: the traces wait, MAX_PENDING at most)
        settings = self._models.get(trace.model, self._global)
        if not target.in_flight and not (settings.on and (settings.file, settings.format) == target.key):
            self._left_by_all(target)  # (tracing left it: OFF, another trace_file, the trace_count spent)
            self._catch_up()

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
        self._left.pop(target.key, None)  # (flush() at close writes it now)
        indexed = target.frequency > 0
        new_file = indexed or not target.written
        if new_file and self._files >= MAX_FILES:
            if self._files == MAX_FILES:
                log.warning("trace: %d trace files written; further traces are dropped (restart the server to "
                            "trace again)", MAX_FILES)
                self._files += 1
            return
        self._files += new_file
        target.written = target.written or not indexed
        path = target.path
        if indexed:  # log_frequency files: name.0, name.1, ... (a file name new to the tracer starts at 0)
            path = f"{path}.{target.index}"
            target.index += 1
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        write = self._writer.submit(_write, self._disk, path, target.format, traces, dropped, indexed)
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


def _write(disk: TraceFiles, path: str, fmt: str, traces: list[RequestTrace], dropped: int, once: bool) -> None:
    disk.write(path, fmt, traces, dropped, once)
