"""Scan and plan: what to load, reload and unload, from the models folder and what is serving.

`rescan` reads the folder (layout.scan, in a worker thread; the config files parsed once while
unchanged: config_reads.ConfigReads, which it owns) and keeps the result as `scan`;
`plans` turns it into the desired state (settle.SettleGate: complete files only, the version
policy, refused files left out) and diffs that against what was acted on (plan.diff). On top:
a model whose config broke keeps serving what it has (its versions whose files are still
there), and models unloaded through the API are left alone. Each scan problem and note is
logged once while it lasts (a scan runs on every change in poll mode), a bug of the scan (its
traceback) too; a config file that does not read while it is still being written is not a problem
yet. Owned by the ModelRepository; loop thread only.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Callable

from ..config import ModelConfig
from ..regular_files import missing, stat_identity
from . import layout
from .config_reads import ConfigReads
from .plan import DesiredState, ModelPlan, diff
from .settle import SettleGate
from .status import WAITING_FOR_CONFIG

log = logging.getLogger(__name__)

# why what a version loads is no longer what the folder holds (file_changed: the log, an UNLOADING reason)
FILE_GONE = "its file is gone"
FILE_REPLACED = "its file was replaced"


class Planner:
    def __init__(self, root: Path, defaults: ModelConfig, gate: SettleGate, unload_missing: bool,
                 wall_clock: Callable[[], float] = time.time):
        self.root = root
        self.scan = layout.ScanResult()  # the latest scan
        self.listed: layout.ScanResult | None = None  # the latest that could list the folder
        self.files_went = False  # the latest scan lacks a model file the listing before it had
        self.pending: dict[str, dict[str, str]] = {}  # name -> version -> the file it waits for (settle.py)
        self.desired: DesiredState = {}  # what the latest plans were made for
        self._gate = gate
        self._reads = ConfigReads(defaults, wall_clock)  # the defaults, and the config files as scans read them
        self._unload_missing = unload_missing  # config.unload_on_delete
        self._logged: set[tuple] = set()

    async def rescan(self) -> layout.ScanResult:
        self.scan = await asyncio.get_running_loop().run_in_executor(None, layout.scan, self.root, self._reads.defaults,
                                                                       self._reads)
        self.files_went = False
        if not self.scan.unreadable:
            self.files_went = self.listed is not None and bool(_model_files(self.listed) - _model_files(self.scan))
            self.listed = self.scan
        return self.scan

    def plans(self, acted: DesiredState, trust: str, refused: frozenset, excluded: set[str]) -> list[ModelPlan]:
        """One plan per model to change, from the latest scan; `acted`: what is serving;
        `trust`: as SettleGate.desired; `refused`: failed files; `excluded`: names to leave."""
        if self.scan.unreadable:  # the folder is missing or could not be listed: change nothing
            self._log_problems()
            return []
        desired, self.pending = self._gate.desired(self.scan, acted, trust, refused)
        self._hold_configs_being_written(trust)
        self._log_problems()
        for name in self.scan.problems:  # a broken config must not unload a serving model...
            if name in acted and name not in desired:
                found = self.scan.versions_found.get(name)  # ...but a version whose file is gone goes
                kept = acted[name] if found is None else {v: w for v, w in acted[name].items() if v in found}
                if kept:
                    desired[name] = kept
        for name in excluded:
            desired.pop(name, None)
        self.desired = desired
        return diff(acted, desired, unload_missing=self._unload_missing)

    def still_wanted(self, name: str, version: str) -> bool:
        """The latest plans still want `version` of `name` served (a load ending looks: what
        changed on disk meanwhile made no plan of its own), or cannot tell yet: its files are
        being written (judged once complete), the folder cannot be listed, or the model is gone
        whole with unload_on_delete off (kept, as plan.diff keeps it)."""
        if self.scan.unreadable or version in self.desired.get(name, {}) or version in self.pending.get(name, {}):
            return True
        return name not in self.desired and not self._unload_missing

    def file_gone(self, name: str, version: str, path: str) -> bool:
        """The file `version` of `name` was loaded from (`path`) is gone: the latest scan does
        not list it, or it is not there now (no scan has seen its deletion yet). A folder that is
        missing or cannot be listed tells nothing; with unload_on_delete off a model gone whole is kept."""
        if self.scan.unreadable:
            return False
        found = self.scan.versions_found.get(name)
        listed = found is not None or name in self.scan.problems  # (files of a problem may not be listed)
        # (missing: a stat, on the loop as settle.py's)
        gone = (found is not None and version not in found) or not listed or missing(path)
        return gone and (self._unload_missing or bool(found))

    def file_changed(self, name: str, version: str, file: layout.VersionFile) -> str:
        """Why what `version` of `name` loads from `file` is stale: FILE_GONE (file_gone), FILE_REPLACED
        (deleted and a new one dropped in, or written over: the latest scan lists another file for it,
        or the file is not now as `file` found it, which no scan has seen yet), else ""."""
        if self.file_gone(name, version, file.path):
            return FILE_GONE
        entry = self.scan.models.get(name)
        found = entry.available.get(version) if entry is not None else None
        if found is not None and found.model_identity != file.model_identity:
            return FILE_REPLACED
        return FILE_REPLACED if not self.scan.unreadable and _rewritten(file) else ""

    def note_event(self, path: str, moved: bool) -> None:
        """A file event (from the watcher): a rename into place makes the file complete."""
        self._gate.note_event(path, moved)

    def next_check(self) -> float | None:
        """Seconds until a file held back may be complete (None: none is held back)."""
        return self._gate.next_check()

    def on_disk(self, name: str, version: str) -> bool:
        entry = self.scan.models.get(name)
        return entry is not None and version in entry.available

    def kept_unselected(self) -> dict[str, set[str]]:
        """name -> the versions on disk that the version_policy it serves with does not select, for
        each model whose config does not read now (a problem) and that serves on with what it had:
        its old selection holds while the broken config is reported, as its old versions serve on
        (their rows went from the index and a request for one was told "has no version N")."""
        kept = {}
        for name in self.scan.config_problems:
            serving = self.desired.get(name)
            if serving:  # (the versions `plans` kept; a refused reload may have left them two configs)
                found = self.scan.versions_found.get(name, set())
                kept[name] = found.difference(*(layout.select_versions(found, wanted.config.version_policy)
                                                for wanted in serving.values()))
        return kept

    def wanted_models(self) -> set[str]:
        """Models on disk with a version their policy selects, as the folder was last listed."""
        return {name for name, entry in (self.listed or self.scan).models.items() if entry.selected}

    def _hold_configs_being_written(self, trust: str) -> None:
        """A config file that does not read, while it has not rested (SettleGate rules), is
        probably being written: its model's problem says it waits for it, unlogged, until it
        rests (a half-written YAML was logged and indexed as invalid). Its model is a problem
        meanwhile all the same: what it serves is kept, nothing new of it loads."""
        for name, (path, problem) in self.scan.config_problems.items():
            if trust != "all" and not self._gate.file_complete(path, trust == "age"):
                problem = WAITING_FOR_CONFIG
            self.scan.problems[name] = problem

    def _log_problems(self) -> None:
        """Each problem and note once while it lasts: one that goes away and comes back is logged again
        (the models folder's own, missing or unreadable, is said gone when it goes);
        the versions a version_policy names that are not there (a WARNING) once per read of its config.
        A bug of the scan is logged with its traceback at ERROR once while it lasts (the same type and
        message: another is logged again), at DEBUG at the scans after (not an ERROR every rescan)."""
        current = {("scan", name, reason) for name, reason in self.scan.problems.items()
                   if reason != WAITING_FOR_CONFIG}
        current |= {("note", note) for note in self.scan.notes}
        # (with the config's stamp: said again once its config is read anew, an edit, not at every rescan)
        current |= {("unfound", said, next(iter(self.scan.models[name].available.values())).config_stamp)
                    for name, said in self.scan.versions_not_found.items()}
        for key in sorted(current - self._logged):
            if key[0] == "scan":
                log.warning("models folder: %s: %s", key[1], key[2])
            elif key[0] == "unfound":
                log.warning("models folder: %s", key[1])
            else:
                log.info("models folder: %s", key[1])
        for name, failure in sorted(self.scan.errors.items()):
            key = ("error", name, failure.what)
            again = " (again, as in an earlier scan)" if key in self._logged else ""
            failure.log(log, logging.DEBUG if again else logging.ERROR, "model %s: scanning its files failed%s", name,
                        again)
            current.add(key)
        for key in self._logged - current:  # (the folder's own problem gone: say so, as its going was said)
            if key[0] == "scan" and key[1] == str(self.root):
                log.info("models folder: %s can be read again", key[1])
        self._logged = current


def _model_files(scan: layout.ScanResult) -> set[str]:
    return {file.path for entry in scan.models.values() for file in entry.available.values()}


def _rewritten(file: layout.VersionFile) -> bool:
    """`file` (its external data files too) is not on disk as the scan found it: replaced or written
    to since (a stat each, on the loop as `missing`'s; the files are not read). The model file
    missing tells nothing here (file_gone judges it: a model gone whole may be kept), nor does a
    stat refused for another reason."""
    try:
        if stat_identity(os.stat(file.path)) != (file.size, file.mtime_ns, file.ctime_ns, file.inode):
            return True
    except OSError:
        return False
    for path, *stamped in file.data_stamp:
        try:
            now = list(stat_identity(os.stat(path)))
        except (FileNotFoundError, NotADirectoryError):
            now = [None]  # (external_data.stamp's word for a file missing)
        except OSError:
            continue
        if now != stamped:
            return True
    return False
