"""Which model files each compile cache entry serves, and the entries none serves any more.

An entry's manifest lists its sources (cache_entry.sources): the model files compiled or loaded from
it, each relative to the cache folder's real path (replicas sharing a volume mounted at other paths
name the same file alike). `adopt` lists a file for the entry it compiled or loaded from and takes
it off the model's other entries of the same compile settings: each is then the compile of the
file's earlier content, and one no file is left for goes. Entries of other settings keep it
(replicas sharing the cache may compile one file differently, for other SoCs say: taken off, each
replica's start removed the other's compile, found by reviewer r21); they go with the file. An entry
is unused when none of the files it lists exists (regular_files.missing: one that only cannot be
reached is kept); `sweep` removes those of a folder. An entry made before manifests listed sources
(none listed, not even an empty list) is judged here by nobody: the retired version's file decides
(compile_cache.py). Each change is made under the entry's lock, only when no process holds it
(entry_locks.if_unheld: a server compiling that entry keeps it), and never to an entry this server
serves from (`in_use`). Blocking (reads manifests): call off the loop.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from ..regular_files import missing
from . import cache_entry, entry_locks
_ENTRY_TAIL = len("-") + 32 + len(".om")  # <model>-<key[:32]>.om (entry_locks.ENTRY_NAME)


def named(folder: Path, source: str) -> str:
    """`source` as the entries of `folder` list it: relative to the folder's real path."""
    return os.path.relpath(os.path.abspath(source), os.path.realpath(folder))


def _path(folder: Path, listed: str) -> str:
    return os.path.normpath(os.path.join(os.path.realpath(folder), listed))


def unused(om: Path) -> bool | None:
    """Whether none of the files the entry at `om` lists exists; None when it lists none (an
    entry made before manifests listed them, or one whose manifest does not read)."""
    listed = cache_entry.sources(om)
    if listed is None:
        return None
    return all(missing(_path(om.parent, source)) for source in listed)


def adopt(folder: Path, om: Path, name: str, source: str, in_use: frozenset[str]) -> list[str]:
    """`source` was compiled or loaded from `om`, an entry of model `name` in `folder`: list it
    there and take it off the model's other entries of the same settings (compiles of its earlier
    content); those no file is left for, and not `in_use`, are removed. Returns the names removed."""
    listed = named(folder, source)
    entry_locks.if_unheld(om, functools.partial(_listing, om, listed, add=True))
    removed = []
    compiled_with = cache_entry.settings(om)
    for other in _entries_of(folder, name):
        if (other != om and listed in (cache_entry.sources(other) or ())  # (looked at again under its lock)
                and compiled_with is not None and cache_entry.settings(other) == compiled_with):
            off = functools.partial(_listing, other, listed, add=False, keep=str(other) in in_use)
            if entry_locks.if_unheld(other, off):
                removed.append(other.name)
    return removed


def _listing(om: Path, listed: str, add: bool, keep: bool = True) -> bool:
    """Under the entry's lock: add `listed` to its sources, or take it off (the entry removed
    when that leaves none, unless `keep`). Whether the entry was removed."""
    sources = cache_entry.sources(om)
    if not om.is_file() or (sources is None and not add):  # (gone meanwhile: nothing to list it in)
        return False
    sources = sources or []
    if add == (listed in sources):
        return False
    sources = sources + [listed] if add else [s for s in sources if s != listed]
    if not sources and not keep:
        return cache_entry.remove(om)
    cache_entry.keep_sources(om, sources)
    return False


def sweep(folder: Path, in_use: frozenset[str]) -> list[str]:
    """Remove the entries of `folder` whose listed files are all gone, but those `in_use`.
    Returns the names removed."""
    return [om.name for om in _entries_of(folder, None) if str(om) not in in_use and unused(om)
            and remove_if_unused(om)]


def remove_if_unused(om: Path, unlisted: bool = False) -> bool:
    """Remove the entry at `om` when it is unused, judged again under its lock (a server may
    have listed a file for it since): `unlisted` says whether an entry listing no files is.
    Whether it was removed (not when another holds its lock)."""
    def under_its_lock() -> bool:
        found = unused(om)
        return bool(unlisted if found is None else found) and cache_entry.remove(om)
    return entry_locks.if_unheld(om, under_its_lock)


def _entries_of(folder: Path, name: str | None) -> list[Path]:
    """The entries in `folder` (of model `name`, when given) that have a manifest."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return []
    return [folder / entry for entry in sorted(names) if entry_locks.ENTRY_NAME.fullmatch(entry)
            and (name is None or entry[:-_ENTRY_TAIL] == name) and f"{entry}{cache_entry.MANIFEST_SUFFIX}" in names]
