"""The trace_file names of one Tracer: where each is written, whether the disk takes it, how many
the API has named, and the one format each file holds.

A name set through the API is a relative name inside trace_dir (absolute paths and `..` are
refused, so a client cannot choose where the server writes); the operator's (the settings the
server started with: --trace, the config file) may name any path. A file holds the format of the
first traces that went to it (Triton's JSON or Chrome's) for the server's life, as later traces
are appended to it (files.py): settings that would trace into it in the other format are refused.
Event-loop thread only.
"""
from __future__ import annotations

import os
from pathlib import Path

from .files import blocked_by
from .settings import TraceSettings, TraceSettingsError

MAX_NAMES = 1_024  # trace_file names set through the API
# a trace_file set through the API, and each folder's or file's name in it, in bytes: within the
# filesystems' 4,096 and 255 (ENAMETOOLONG stopped every write), with room for what the writer
# adds to the name (".<index>" with a log_frequency, "." and ".tmp" while it writes)
MAX_NAME_BYTES = 1_024
MAX_PART_BYTES = 200


class TraceNames:
    def __init__(self, trace_dir: str, operator_file: str):
        self._trace_dir = trace_dir
        self.operator_file = operator_file  # the start-up settings' file: any path
        self._names: set[str] = set()  # set through the API
        self._formats: dict[str, str] = {}  # absolute path -> the format of the traces that went to it

    def path(self, name: str) -> str:
        """Where the file `name` is written; TraceSettingsError when the API may not name it."""
        if name == self.operator_file:
            return name
        path = Path(name)
        if path.is_absolute():  # (not quoted: shown to a client, it would lose its folders, redact.py)
            raise TraceSettingsError("trace_file: must be a relative name inside the trace folder, "
                                     "not an absolute path")
        if ".." in path.parts or not path.parts:
            raise TraceSettingsError(f"trace_file: must be a relative name inside the trace folder, got {name!r}")
        if len(name.encode()) > MAX_NAME_BYTES or any(len(part.encode()) > MAX_PART_BYTES for part in path.parts):
            raise TraceSettingsError(f"trace_file: longer than {MAX_NAME_BYTES} bytes, or a folder or file name in it "
                                     f"longer than {MAX_PART_BYTES} (UTF-8)")
        return str(Path(self._trace_dir) / path)

    def check(self, new: TraceSettings, old: TraceSettings) -> None:
        """Refuse the trace_file of `new` (which replaces `old`) when the API may not name it, the
        disk would stop every write of it, or it is a name more than MAX_NAMES. Changes nothing:
        `taken` counts the name once the whole update is accepted."""
        if not new.file or new.file == self.operator_file:
            return
        self.path(new.file)
        # checked when the file written changes: another name, or the name itself once
        # log_frequency stops writing name.N beside it (a name in force stays, whatever the disk says)
        if new.file != old.file or (new.log_frequency == 0 and old.log_frequency > 0):
            self._check_writable(new.file, new.log_frequency > 0)
        if new.file not in self._names and len(self._names) >= MAX_NAMES:
            raise TraceSettingsError(f"trace_file: this server has taken {MAX_NAMES} trace_file names "
                                     f"already; use one of them again")

    def taken(self, new: TraceSettings) -> None:
        if new.file and new.file != self.operator_file:
            self._names.add(new.file)

    def check_formats(self, tracing: list[tuple[str, TraceSettings]]) -> None:
        """Refuse settings that would put two formats into one file: `tracing` are the settings
        in force after an update, with whose they are ("" for the ones updated, else "the
        global settings", "model 'm'"), those with a trace_file and a level other than OFF.
        The ones updated are checked last, against the format each file holds already or takes
        from the others, so the refusal names them and the format they met."""
        holders: dict[str, tuple[str, str]] = {}  # absolute path -> (format, whose settings trace to it in it)
        for whose, settings in sorted(tracing, key=lambda entry: entry[0] == ""):  # the ones updated last
            key = os.path.abspath(self.path(settings.file))
            if key in self._formats:
                held, holder = self._formats[key], None
            else:
                held, holder = holders.setdefault(key, (settings.format, whose))
            if held != settings.format:
                traces = f"{settings.format} traces of {whose}" if whose else f"{settings.format} traces"
                why = f"it holds {held} traces already" if holder is None else f"it takes {held} traces from {holder}"
                raise TraceSettingsError(f"trace_format: {traces} cannot go to {settings.file!r}: {why} (a trace "
                                         f"file holds one format, as this server appends to it); name another "
                                         f"trace_file for the {settings.format} traces")

    def took(self, path: str, fmt: str) -> None:
        """Traces in `fmt` go to `path` (its first ones set the format it holds)."""
        self._formats.setdefault(os.path.abspath(path), fmt)

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
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: {blocker.name!r} is a file, "
                                     "not a folder")
        folder = path.parent  # (indexed: name.0, name.1, ... are written beside the name)
        try:  # made now: one that could not be (trace_dir unwritable) lost every trace, said only in the log
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: its folder cannot be made "
                                     f"({e.strerror or e}; see trace_dir in the config)") from None
        if not os.access(folder, os.W_OK):
            raise TraceSettingsError(f"trace_file: {name!r} cannot be written: its folder is not writable "
                                     "(see trace_dir in the config)")
