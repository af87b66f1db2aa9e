"""Each model's config file as a scan last read it, kept while the file is unchanged.

Every scan (at each change of the folder, and every RESCAN_S in poll mode) parsed each model's
config file again. PyYAML's reader is pure Python: a tester's broken 1 MB YAML cost the idle
server 9.3 s of CPU every 40 s, the GIL with it (another model's p99 went from 11 to 53 ms, t92).
Now a file is parsed once per identity (size, mtime, ctime and inode: regular_files.stat_identity),
what it gave kept by path, its refusal too; a scan stats the file and reuses them while its
identity holds. A config.pbtxt's message is kept so, and its settings beside it, for the backend
its version folders make it (their files are not the config's: looked at every scan).

Not kept: a file that could not be read (ConfigFileUnread: too many open files, say), nor a
file changed less than FRESH_S ago: timestamps tick coarsely on many filesystems (a jiffy, a
second or two), and a write within the tick of the read would leave the identity as the read
found it; such a file is parsed at each scan until it rests. On NFS a stat may answer from the
client's attribute cache (acregmax, 60 s by default), where an open checked with the server: an
edit made on another host is seen when that cache expires (a review). Files a scan that listed the folder
did not read (gone, renamed, another config read instead) are dropped: one entry per config file
at most. Owned by the Planner; used by layout.scan in a worker thread (a lock over the table, the
parses outside it).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import PBTXT, ConfigError, ConfigFileUnread, ModelConfig, load_model_config, load_triton_config, \
    read_pbtxt
from ..config.triton_backend import triton_backend
from ..regular_files import node_kind, stat_identity

log = logging.getLogger(__name__)

FRESH_S = 2.0  # a file changed this recently may change again without a new identity (FAT's mtime: 2 s)


@dataclass
class _Kept:
    identity: tuple
    read: object  # what the file's reader gave: (ModelConfig, notes) of a YAML, a config.pbtxt's message,
    #               or the ConfigError it raised (no traceback: it would hold the frames of its scan)
    # a config.pbtxt's: its backend -> (ModelConfig, notes) or refusal (its model's name is its folder's)
    settings: dict = field(default_factory=dict)


class ConfigReads:
    """The model config files' reads for one set of defaults (a scan's `reads`)."""

    def __init__(self, defaults: ModelConfig, wall_clock: Callable[[], float] = time.time):
        self.defaults = defaults  # the settings a model's file merges over
        self._wall = wall_clock  # (the settle gate's: what a file's ctime is compared with)
        self._kept: dict[str, _Kept] = {}  # path -> what its reading gave
        self._used: set[str] = set()  # the paths read since the last scan ended
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many files' reads are kept."""
        with self._lock:
            return len(self._kept)

    def pbtxt(self, path: Path):
        """read_pbtxt's message of the config.pbtxt at `path`; ConfigError as read_pbtxt raises it."""
        return _outcome(self._kept_read(path, lambda: read_pbtxt(path)).read)

    def settings(self, path: Path, name: str, pbtxt=None) -> tuple[ModelConfig, tuple[str, ...]]:
        """Model `name`'s settings from its config file at `path` (a YAML, or a config.pbtxt) over the
        defaults, and the notes reading it said; ConfigError as load_model_config (load_triton_config)
        raises it. `pbtxt`: the config.pbtxt's message `pbtxt()` gave for this scan."""
        if path.name != PBTXT:
            return _outcome(self._kept_read(path, lambda: _with_notes(
                lambda notes: load_model_config(path, self.defaults, notes))).read)
        kept = self._kept_read(path, lambda: read_pbtxt(path)) if pbtxt is None else self._kept_message(path, pbtxt)
        message = _outcome(kept.read)
        backend = triton_backend(message, path.parent)  # (load_triton_config asks the same)
        settings = kept.settings.get(backend)
        if settings is None:
            settings = _kept_outcome(lambda: _with_notes(
                lambda notes: load_triton_config(path, name, self.defaults, notes, message)))
            with self._lock:
                kept.settings[backend] = settings
        return _outcome(settings)

    def scanned(self) -> None:
        """A scan that listed the folder ended: what it did not read is forgotten."""
        with self._lock:
            self._kept = {path: kept for path, kept in self._kept.items() if path in self._used}
            self._used = set()

    def _kept_read(self, path: Path, read: Callable[[], object]) -> _Kept:
        """What read() (the file at `path`'s reader) gives, kept: read again only if the file is new
        or its identity changed."""
        key, identity = str(path), self._identity(path)
        with self._lock:
            self._used.add(key)
            kept = self._kept.get(key)
        if kept is not None and identity is not None and kept.identity == identity:
            return kept
        log.debug("models folder: parsing %s (new or changed)", path)
        try:
            kept = _Kept(identity, _kept_outcome(read))
        except BaseException:  # (ConfigFileUnread: it says nothing of the file; a bug of the scan)
            with self._lock:
                self._kept.pop(key, None)
            raise
        with self._lock:  # (one of another identity replaced; one too fresh to keep dropped)
            if identity is None:
                self._kept.pop(key, None)
            else:
                self._kept[key] = kept
        return kept

    def _kept_message(self, path: Path, message) -> _Kept:
        """The entry `message` (what pbtxt() gave this scan) is kept in, or a new one kept nowhere
        (its file was not kept: its settings are worked out again too)."""
        with self._lock:
            kept = self._kept.get(str(path))
        return kept if kept is not None and kept.read is message else _Kept((), message)

    def _identity(self, path: Path) -> tuple | None:
        """The file's identity, None when what it gives may not be kept: a file that cannot be
        stat'ed or is not a regular file (its reader refuses it, unopened), or one changed less
        than FRESH_S ago (by its ctime, which no one sets back)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        if node_kind(st.st_mode) is not None or self._wall() - st.st_ctime < FRESH_S:
            return None
        return stat_identity(st)


def _with_notes(load: Callable[[list[str]], ModelConfig]) -> tuple[ModelConfig, tuple[str, ...]]:
    """load(notes)'s settings, and the notes it said."""
    said: list[str] = []
    return load(said), tuple(said)


def _kept_outcome(read):
    """read()'s value, or the ConfigError it raised, without its traceback and context; a
    ConfigFileUnread is raised on."""
    try:
        return read()
    except ConfigFileUnread:
        raise
    except ConfigError as e:
        return _copy(e)


def _outcome(kept):
    """A value kept, or its refusal raised (a copy: the one kept holds no traceback)."""
    if isinstance(kept, ConfigError):
        raise _copy(kept)
    return kept


def _copy(error: ConfigError) -> ConfigError:
    """`error` anew (its type, message and attributes), without its traceback or context."""
    again = type(error).__new__(type(error), *error.args)
    again.__dict__.update(error.__dict__)
    return again
