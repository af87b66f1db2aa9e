"""The compile cache of one repository: what a dropped .onnx is served from, and what is kept.

`compiled` finds the folder (cache_dir) and returns the entry for an .onnx, compiling it on a miss
(compiler), and lists the file as that entry's (cache_sources.adopt): the model's entries of the
file's earlier content (same compile settings) go; those of other settings go with the file.
`release` removes the entry of a retired version when no model file it lists is left, and `sweep`
(at the start, and after a scan found a model file gone) every such entry, so the cache does not
grow without bound: not with a dropped .onnx replaced again and again, nor a file replaced while the
server was down, nor one deleted after its model was unloaded. The entry of a file that is still
there stays (a version unloaded, a release switch's other folder served: loaded again, or rolled
back, it is used), and so do entries of versions closed at shutdown, for the next start; nothing is
removed while the models folder is missing, nor an entry this server serves from (`in_use`, the
Lifecycle's) or another process holds the lock of. Owned by the repository's Lifecycle: `compiled`
and `sweep` block (call them in a worker thread; the compile itself runs in a child process),
`release` runs on the loop.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from ..config import CompileOptions
from ..om.compile_process import CompileStop
from ..quoting import listed_names
from ..regular_files import missing
from . import cache_dir, cache_entry, cache_sources, compiler, entry_locks

log = logging.getLogger(__name__)
FULL = (errno.ENOSPC, errno.EDQUOT)
UNUSED_NAMED = 8  # entries a sweep names in its line


class CompileCache:
    def __init__(self, configured: str, models_dir: str, timeout_s: float | None = None):
        self._configured = configured  # compile_cache_dir ("" = beside the models, or the user cache)
        self._models_dir = models_dir
        self._timeout_s = timeout_s  # compile_timeout_s: how long a compile may run (None: no bound)
        self._here = entry_locks.CompilesHere()  # (another server's in this process waits as another process's)
        # the entries the serving versions loaded: replaced whole on the loop, read by the load threads
        self.in_use: frozenset[str] = frozenset()

    def compiled(self, onnx_path: str, name: str, options: CompileOptions, runtime_kind: str,
                 soc_name: str | None, progress=None, stop: CompileStop | None = None,
                 declared_dims: dict | None = None, batch_optional: bool = False) -> str:
        """The .om to load for `onnx_path` (blocking: compiles on a cache miss, in a child
        process, said to `progress(step)` first; `stop` ends it: CompileStopped; one past the
        timeout fails: CompileError). `declared_dims`, `batch_optional`: compiler.compiled_om's."""
        folder = cache_dir.resolve(self._configured, self._models_dir)
        try:
            om = compiler.compiled_om(onnx_path, name, options, runtime_kind, folder, soc_name, progress, stop,
                                      self._timeout_s, self._here, declared_dims, batch_optional)
        except OSError as e:
            told = _told(e, folder)
            if told is e:
                raise
            raise told from e
        try:
            removed = cache_sources.adopt(folder, om, name, onnx_path, self.in_use)
        except OSError as e:  # housekeeping only: the load goes on
            log.info("%s: compile cache: could not list %s as %s's: %s", name, onnx_path, om.name, e)
            removed = []
        for entry in removed:
            log.info("%s: removed the compile %s: no model file uses it now (its file was replaced)", name, entry)
        return str(om)

    def index_bounds(self, onnx_path: str, om_path: str) -> dict[str, int]:
        """The integer inputs of the compile at `om_path` that index a table (its manifest's), or
        for an entry made before manifests kept them, read from the .onnx now and kept for the
        next load where the cache folder can be written. Blocking."""
        found = cache_entry.index_bounds(om_path)
        if found is not None:
            return found
        found = compiler.source_index_bounds(onnx_path)
        if found is None:  # (not kept: read again at the next load)
            return {}
        try:
            cache_entry.keep_index_bounds(om_path, found)
        except OSError as e:
            log.info("compile cache: could not add the input bounds to %s's manifest: %s", Path(om_path).name, e)
        return found

    def sweep(self) -> None:
        """Blocking: remove what interrupted compiles left in the cache folder, when there is
        one (entry_locks.sweep), and the entries no model file uses (cache_sources.sweep)."""
        try:
            if self._configured:
                folders = [Path(self._configured)]
            else:  # either may have been compiled into (cache_dir.resolve); none is made here
                local, outside = cache_dir.local_folder(self._models_dir)
                folders = ([] if outside else [local]) + [cache_dir.user_cache_folder(self._models_dir)]
            folders = [folder for folder in folders if folder.is_dir()]
            removed = sum(entry_locks.sweep(folder) for folder in folders)
            there = os.path.isdir(self._models_dir)  # (missing: its files may be there, only not reached)
            unused = [entry for folder in folders if there for entry in cache_sources.sweep(folder, self.in_use)]
        except (OSError, RuntimeError) as e:  # housekeeping only (RuntimeError: no home folder found)
            log.warning("compile cache: could not look for what interrupted compiles left: %s", e)
            return
        if removed:
            log.info("compile cache: removed what %d interrupted compile%s left (an entry without its manifest, "
                     "a work folder)", removed, "" if removed == 1 else "s")
        if unused:  # (the first few named: a cache copied in from another folder listed 160 in one line)
            log.info("compile cache: removed %d compile%s no model file uses now (%s)", len(unused),
                     "" if len(unused) == 1 else "s", listed_names(unused, UNUSED_NAMED))

    def release(self, name: str, version: str, om_path: str, source: str, replaced: bool) -> None:
        """Version `name:version` that loaded `om_path` (from `source`) was retired: delete the
        entry when no model file it lists is left (an entry listing none, made before manifests
        listed them: when the version was `replaced` by a file at the same path or its source is
        gone), unless a serving version uses it. A file that only cannot be reached (the models
        folder missing, a folder on its way that cannot be searched) is no file gone."""
        if om_path == source or om_path in self.in_use:  # (the former: an .om of the models folder itself)
            return
        if not os.path.isdir(self._models_dir):
            return  # nothing is known of the models folder now
        if cache_sources.remove_if_unused(Path(om_path), unlisted=replaced or missing(source)):
            log.info("%s: removed the compile of the retired version %s (%s)", name, version, Path(om_path).name)


def _told(error: OSError, folder: Path) -> OSError:
    """`error` as the model's reason says it (its load's log line and /metrics label too), the
    same at every retry: a full disk or quota names the cache folder, whichever of its files the
    write was to (a write says none; a compile's work folder, `.<entry>.compiling-<random>`, has
    a new name at every try); another error in a work folder names the entry being compiled."""
    inside = _under(error.filename, folder)
    if error.errno in FULL and (error.filename is None or inside is not None):
        # (the folder after the words: a reason shows a configured folder by its name, and "the compile
        # cache cache" is what a folder named cache read as)
        return OSError(error.errno, f"{error.strerror}: {folder}, the compile cache")
    entry = entry_locks.work_entry(inside.parts[0]) if inside is not None else None
    return error if entry is None else OSError(error.errno, error.strerror, str(folder / entry))


def _under(filename, folder: Path) -> Path | None:
    """`filename` (an OSError's) relative to `folder` when it is in it, else None."""
    if not isinstance(filename, (str, bytes)):
        return None
    relative = Path(os.path.relpath(os.path.abspath(os.fsdecode(filename)), os.path.abspath(folder)))
    return None if relative.parts[:1] in ((), ("..",)) else relative  # (the folder itself, or outside it)
