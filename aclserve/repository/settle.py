"""When is a model file complete? Decides which scanned files may be loaded.

A file is taken when
- it arrived through a rename (a moved-to event for its path) and has not changed since the
  first look after the rename, or
- its identity (size, mtime, ctime, inode) was seen unchanged for `settle_s` (observed by
  this gate with its clock), or
- on the very first scan only (trust="age"): its mtime is at least `settle_s` old by the
  wall clock. A write updates the mtime, so an old mtime means nobody wrote for settle_s; this
  lets startup load existing files at once instead of waiting one settle period.
A created/modified event for a path revokes the rename trust: it is being written again. A
version is complete when its model file and each config or labels file it is served with are,
each judged on its own (a config renamed into place is taken at once). A file that changes more
often than every `settle_s` is still being written: it is not taken until it rests; so is the
absence of a config file a serving model was read from (an editor may rename it away to write
a new one).

Files not yet complete are held back: the version keeps what was last acted on for it (so
a file being rewritten never triggers a reload of a partial file) or stays absent. The
caller reschedules a scan after `next_check()` seconds. Owned by the Planner, used on the
event loop only (not thread-safe); clocks are injectable for tests.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from ..regular_files import stat_identity
from .layout import ScanResult, VersionFile, select_versions
from .plan import DesiredState, Wanted
from .status import WAITING_FOR_CONFIG, WAITING_FOR_FILE, WAITING_FOR_LABELS


class SettleGate:
    def __init__(self, settle_s: float, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.settle_s = settle_s
        self._clock = clock
        self._wall = wall_clock
        self._moved: dict[str, tuple | None] = {}  # path -> identity at first look after rename
        self._seen: dict[str, tuple[tuple, float]] = {}  # path -> (identity, first seen at)
        self._pending_since: list[float] = []

    def note_event(self, path: str, moved: bool) -> None:
        path = os.path.realpath(path)
        if moved:
            self._moved[path] = None
        else:
            self._moved.pop(path, None)

    def waiting_for(self, vf: VersionFile, labels: set[str], trust_age: bool = False) -> str | None:
        """None when the model file and each config or labels file it is served with are
        complete, each by the rules above on its own: a config renamed into place is taken at
        once, as a model file is (judged with the model file's identity, it waited settle_s).
        Else which one it waits for, as the index says it: the model file, else its config file,
        else a labels file (`labels`: those its config names). A version whose config edit is
        settling was said to wait "for the file" (an independent tester)."""
        complete = [self._part_complete(path, ident, mtime_ns, trust_age) for path, ident, mtime_ns in _parts(vf)]
        if all(complete):  # (each part judged: every one not complete counts for next_check)
            return None
        if not complete[0]:
            return WAITING_FOR_FILE
        named = [entry[0] for entry in vf.config_stamp if entry[1] is not None]  # (parts 1..., in order)
        return WAITING_FOR_LABELS if all(done or path in labels for done, path in zip(complete[1:], named)) \
            else WAITING_FOR_CONFIG

    def _config_complete(self, entry, trust: str) -> bool:
        """The model's config and labels files (the same for all its versions) are complete."""
        if trust == "all" or not entry.available:
            return True
        parts = _parts(next(iter(entry.available.values())))[1:]
        return all([self._part_complete(path, ident, mtime_ns, trust == "age") for path, ident, mtime_ns in parts])

    def _config_just_gone(self, acted: dict[str, Wanted] | None, trust: str, live_paths: set) -> bool:
        """The config file a model serves with is gone, for less than `settle_s`: an editor that
        renames the file away and then writes a new one (vim) would have the model reloaded with
        the defaults (its labels lost), then again with the config back. Its absence settles as
        a write does; then a config deleted is acted on."""
        if trust == "all" or not acted:
            return False
        path = next(iter(acted.values())).config_path()
        if path is None or os.path.lexists(path):
            return False
        real = os.path.realpath(path)
        live_paths.add(real)  # its record of absence is kept while it settles
        return not self._absence_complete(real, False)

    def file_complete(self, path: str, trust_age: bool = False) -> bool:
        """Any one file by the same rules (a config file that did not read); one gone is."""
        try:
            st = os.stat(path)
        except OSError:
            if not os.path.islink(path):
                return True
            # a link to nothing: its target may be being saved (vim renames it away first), so
            # its absence settles as a write does; keyed by the link, which the scans still list
            return self._absence_complete(os.path.abspath(path), trust_age)
        real = os.path.realpath(path)
        return self._part_complete(real, (real, *stat_identity(st)), st.st_mtime_ns, trust_age)

    def _absence_complete(self, key: str, trust_age: bool) -> bool:
        """A file's absence, settled as a write is (it may be coming back)."""
        return self._part_complete(key, (key, None), 0, trust_age)

    def _part_complete(self, path: str, ident: tuple, mtime_ns: int, trust_age: bool) -> bool:
        now = self._clock()
        if path in self._moved:
            first = self._moved[path]
            if first is None or first == ident:
                self._moved[path] = ident
                self._seen[path] = (ident, now - self.settle_s)
                return True
            del self._moved[path]  # changed after the rename: fall back to settling
        seen = self._seen.get(path)
        if seen is None or seen[0] != ident:
            if trust_age and self._wall() - mtime_ns / 1e9 >= self.settle_s:
                self._seen[path] = (ident, now - self.settle_s)
                return True
            self._seen[path] = (ident, now)
            self._pending_since.append(now)
            return self.settle_s <= 0
        if now - seen[1] >= self.settle_s:
            return True
        self._pending_since.append(seen[1])
        return False

    def desired(self, scan: ScanResult, acted: DesiredState, trust: str = "settle",
                rejected: frozenset = frozenset()) -> tuple[DesiredState, dict[str, dict[str, str]]]:
        """The desired state using complete files only, and name -> version -> what it waits for
        (`waiting_for`), for each version whose files are not complete yet.

        An incomplete file's version keeps what `acted` (the state last acted on) has for it,
        file and config both, so nothing reloads until the file is complete; versions are
        selected by the model's policy among complete (or held) files only, so a newer
        version still being written never pushes out the serving one. Files in `rejected`
        ((name, version, identity) that failed to load) are left out of the selection too; when
        the policy selects none but such files, what was acted on stays.
        trust: "settle" (the rules above), "age" (also accept an old mtime: the first scan),
        "all" (every file is complete: explicit loads, where the operator vouches for them).
        """
        self._pending_since = []
        desired: DesiredState = {}
        pending: dict[str, dict[str, str]] = {}
        live_paths = set()
        for name, entry in scan.models.items():
            usable: dict[str, Wanted] = {}
            labels = {o.labels for o in entry.config.outputs.values() if o.labels}
            for version, vf in entry.available.items():
                live_paths.update(path for path, _, _ in _parts(vf))
                refused = (name, version, vf.identity) in rejected
                waits = None if refused or trust == "all" else self.waiting_for(vf, labels, trust == "age")
                if not refused and waits is None:
                    usable[version] = Wanted(vf, entry.config)
                    continue
                if not refused:
                    pending.setdefault(name, {})[version] = waits
                held = acted.get(name, {}).get(version)
                if held is not None:
                    usable[version] = held
            wanted = {}
            if self._config_complete(entry, trust) and not self._config_just_gone(acted.get(name), trust, live_paths):
                wanted = {v: usable[v] for v in select_versions(usable, entry.config.version_policy)}
            if not wanted:
                # its version policy is not known yet (a half-saved switch unloaded the serving
                # version for settle_s), or it selects only files that failed to load or are
                # still being written (it selects some: else the model is a scan problem;
                # `specific: [2]` with 2 refused, or 2 being fixed, unloaded the serving 1):
                # what was acted on stays, as far as its files are there
                wanted = {v: w for v, w in acted.get(name, {}).items() if v in entry.available}
            if wanted:
                desired[name] = wanted
        # forget files that are gone so the maps do not grow (a file the scan did not list, as
        # its model is a problem now, is kept: forgotten, it settled again once the problem was fixed)
        for table in (self._seen, self._moved):
            for path in [p for p in table if p not in live_paths and not os.path.lexists(p)]:
                if table is self._seen or self._moved[path] is not None:
                    del table[path]
        return desired, pending

    def next_check(self) -> float | None:
        """Seconds until the earliest pending file may be complete (None: nothing pending)."""
        if not self._pending_since:
            return None
        return max(0.0, min(self._pending_since) + self.settle_s - self._clock())


def _parts(vf: VersionFile) -> list[tuple[str, tuple, int]]:
    """(path, identity, mtime_ns) of the model file and of each config or labels file it is
    served with that exists (one gone is no write in progress: the load says it is missing)."""
    parts = [(vf.path, vf.model_identity, vf.mtime_ns)]
    # keyed and identified by the real path: two configs naming one labels file by other paths
    # (../labels.txt from two folders) reset each other's first look on every scan, for good
    parts += [(real, (real,) + entry[1:], entry[2]) for entry in vf.config_stamp if entry[1] is not None
              for real in (os.path.realpath(entry[0]),)]
    return parts
