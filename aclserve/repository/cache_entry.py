"""Compile cache entries that prove what they are: a manifest beside each cached .om.

`<entry>.om.json` records the cache key (SHA-256 of the source, the compile options and the
target), the options and target in clear, the SHA-256 and size of the .om itself, what the
compile read from the source for the server (the integer inputs indexing a table), and the model
files compiled or loaded from it (cache_sources.py). An entry
is used only when its manifest is readable, names the key being looked up, and the .om's bytes
hash to the recorded figure; anything else (a truncated or edited .om, another model's .om
copied over it, a missing manifest from an older version, a FIFO in place of either: read
without opening it; a symbolic link in place of either, never followed: whoever can write the
cache folder cannot have the server serve or describe a file elsewhere as its own, and the link
alone is deleted, not what it leads to) is deleted and compiled again. A folder where one of an entry's files goes
(which no rename can replace) is removed when empty; one with files in it was not made by
aclserve, which deletes no folder it did not make: EntryBlocked says so, and the model is not
served until it is gone. Blocking (reads the .om): call off the loop.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..regular_files import node_kind, open_regular

MANIFEST_SUFFIX = ".json"
FORMAT = 1
BOUNDS_RULES = 2  # om/index_bounds.RULES (not imported: onnx is a heavy import the server may not need)
# what a compile's checks refuse, in the cache key (compiler.cache_key): raised when they refuse
# more (an output sized by the data, rows mixed by a branch on the whole batch: 2026-12-06), so an
# entry a laxer aclserve built is built again, and refused, not served from the cache
COMPILE_RULES = 2


def manifest_path(om_path: str | os.PathLike) -> Path:
    return Path(str(om_path) + MANIFEST_SUFFIX)


def _digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open_regular(path, follow_links=False) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def problem(om_path: str | os.PathLike, key: str) -> str | None:
    """Why the entry at `om_path` must not be used for `key`, or None when it is sound."""
    om = Path(om_path)
    try:
        record = _read(om)
    except FileNotFoundError:
        return "it has no manifest"
    except (OSError, ValueError) as e:
        return f"its manifest is unreadable ({e})"
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return "its manifest is of an unknown format"
    if record.get("key") != key:
        return "its manifest is for another source or other compile options"
    try:
        sha, size = _digest(om)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if size != record.get("om_size") or sha != record.get("om_sha256"):
        return "its content does not match its manifest (changed or corrupted)"
    return None


def record(om_path: str | os.PathLike, key: str, options: dict, target: str,
           index_bounds: dict[str, int] | None = None) -> None:
    """Write the manifest of a freshly compiled entry (atomically: temp file + rename), with
    what the compile read from the source for the server (om/index_bounds.py)."""
    om = Path(om_path)
    sha, size = _digest(om)
    _write(om, {"format": FORMAT, "key": key, "target": target, "options": options, "om_sha256": sha,
                "om_size": size, "index_bounds": index_bounds or {}, "index_bounds_rules": BOUNDS_RULES})


def _write(om: Path, doc: dict) -> None:
    final = manifest_path(om)
    try:
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    except OSError as e:  # (named as the manifest: the temporary file's name is new at every try)
        raise OSError(e.errno, e.strerror, str(final)) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, sort_keys=True)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600: replicas running as other users read it (as the .om)
        os.replace(tmp, final)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(final)) from e
        raise


def index_bounds(om_path: str | os.PathLike) -> dict[str, int] | None:
    """The integer inputs of a sound entry that index a table, {name: entries}; None for an
    entry whose manifest does not say, or says under other rules (written before manifests
    kept them, or by an earlier edition of om/index_bounds.py: keep_index_bounds)."""
    record = _read(om_path)
    found = record.get("index_bounds")
    if not isinstance(found, dict) or record.get("index_bounds_rules") != BOUNDS_RULES:
        return None
    return {k: v for k, v in found.items() if isinstance(k, str) and type(v) is int and v >= 0}


def keep_index_bounds(om_path: str | os.PathLike, bounds: dict[str, int]) -> None:
    """Add `bounds` to the manifest of a sound entry that lacked them (atomically)."""
    _write(Path(om_path), dict(_read(om_path), index_bounds=bounds, index_bounds_rules=BOUNDS_RULES))


def sources(om_path: str | os.PathLike) -> list[str] | None:
    """The model files the entry lists as compiled or loaded from it (cache_sources.py), or
    None when its manifest lists none (written before manifests did) or does not read."""
    try:
        found = _read(om_path).get("sources")
    except (OSError, ValueError, AttributeError):  # (AttributeError: JSON that is no object)
        return None
    return [s for s in found if isinstance(s, str)] if isinstance(found, list) else None


def settings(om_path: str | os.PathLike) -> tuple | None:
    """What the entry was compiled with (its options and target), or None when its manifest
    does not read: entries of one file alike in these differ only in the file's content."""
    try:
        doc = _read(om_path)
        return json.dumps(doc.get("options"), sort_keys=True), doc.get("target")
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def keep_sources(om_path: str | os.PathLike, listed: list[str]) -> None:
    """Make `listed` the entry's sources (atomically; under the entry's lock: cache_sources.py)."""
    _write(Path(om_path), dict(_read(om_path), sources=listed))


def _read(om_path: str | os.PathLike) -> dict:
    with open_regular(manifest_path(om_path), "r", "utf-8", follow_links=False) as f:
        return json.loads(f.read())


class EntryBlocked(OSError):
    """A folder with files in it stands where a file of the compile cache goes."""


def not_a_file(om_path: str | os.PathLike) -> str | None:
    """What stands where the entry's .om goes when it is not a regular file ("a folder", "a
    FIFO", "a link to nothing"...), or None (a regular file, or nothing)."""
    try:
        return node_kind(os.stat(om_path).st_mode)
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(om_path) else None


def clear(path: str | os.PathLike) -> bool:
    """Remove what stands at `path`, one of an entry's files: a file, link or other node, or an
    empty folder; a folder with files in it raises EntryBlocked (it may not be aclserve's to
    delete). Nothing there is fine. Whether something was removed."""
    path = Path(path)
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError:
        if path.is_symlink() or not path.is_dir():
            raise
    try:
        path.rmdir()  # only ever an empty one
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise EntryBlocked(f"{path} in the compile cache is a folder with files in it, where aclserve keeps a "
                           f"file of its own; it deletes no folder it did not make: remove it, then load the model "
                           f"again (or set compile_cache_dir to another folder)") from None


def remove(om_path: str | os.PathLike) -> bool:
    """Delete the entry and its manifest (either may already be gone), whatever stands there
    (clear: EntryBlocked for a folder with files in it). Whether either was there."""
    removed = [clear(path) for path in (Path(om_path), manifest_path(om_path))]
    return any(removed)
