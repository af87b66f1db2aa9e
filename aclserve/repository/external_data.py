"""The external data files a dropped .onnx names: weights kept beside the graph (exporters
write models over protobuf's 2 GB that way, `model.onnx.data` say). They are part of the model:
the compile cache's key hashes them (compiler.cache_key) and the scan's identity of the version
stamps them (layout.VersionFile), so a re-export that changes only the weights is compiled and
served anew, and a .data file that comes after its .onnx is tried again. Without them a second
version with the same graph and other weights was served with the first one's.

A file is read once per identity (kept by path, so a folder of any size is not read again at
every scan) to look for the bytes an external tensor's `location` entry is written as; only a
file that has them is parsed (without its data). Files named outside the model's folder are
left out: the compile refuses them itself (onnx does). What a path named is forgotten at the
first scan of its models folder that did not look at it (`scan_began`, `scan_ended`): with models
replaced and deleted, the paths gone were kept until MAX_KNOWN (a server's model churn held them
for good). Forgetting costs a dropped path a read again at most, if it comes back.
"""
from __future__ import annotations

import os
import threading

from ..regular_files import open_regular, stat_identity

# a StringStringEntryProto whose key is "location", as onnx writes an external tensor's entry
_MARKER = b"\n\x08location"
_CHUNK = 1 << 20
MAX_KNOWN = 65_536  # paths remembered (each: its identity and the files it names); past it, forgotten all


class _Known:
    __slots__ = ("identity", "files", "asked")

    def __init__(self, identity: tuple, files: tuple[str, ...], asked: int):
        self.identity, self.files = identity, files
        self.asked = asked  # the number of the last scan begun when the path was last asked for


_known: dict[str, _Known] = {}  # path -> what it named: scans run in worker threads
_known_lock = threading.Lock()
_scans_begun = 0  # any models folder's, numbered (scans of several folders may overlap)


def named_files(onnx_path: str) -> tuple[str, ...]:
    """The external data files `onnx_path` names (absolute, sorted; not checked to exist)."""
    try:
        st = os.stat(onnx_path)
    except OSError:
        return ()
    identity = stat_identity(st)
    with _known_lock:
        known = _known.get(onnx_path)
        if known is not None and known.identity == identity:
            known.asked = _scans_begun
            return known.files
    files = _named(onnx_path)
    with _known_lock:
        if len(_known) >= MAX_KNOWN:
            _known.clear()
        _known[onnx_path] = _Known(identity, files, _scans_begun)
    return files


def scan_began() -> int:
    """A scan of a models folder begins: its number, for its `scan_ended`."""
    global _scans_begun
    with _known_lock:
        _scans_begun += 1
        return _scans_begun


def scan_ended(root: str, began: int) -> None:
    """The scan `began` numbers listed the models folder `root` (its real path): the paths in it
    not asked for since it began are gone from it (or not looked at: read again if they come back)."""
    inside = root.rstrip(os.sep) + os.sep
    with _known_lock:
        gone = [path for path, known in _known.items() if known.asked < began and path.startswith(inside)]
        for path in gone:
            del _known[path]


def stamp(onnx_path: str) -> tuple:
    """(path, size, mtime, ctime, inode) of each external data file, (path, None) for one missing."""
    out = []
    for path in named_files(onnx_path):
        try:
            st = os.stat(path)
            out.append((path, *stat_identity(st)))
        except OSError:
            out.append((path, None))
    return tuple(out)


def _named(onnx_path: str) -> tuple[str, ...]:
    if not _has_marker(onnx_path):
        return ()
    import onnx  # (heavy: only for a model that names external data)
    from ..om.external_files import external_locations
    try:
        model = onnx.load(onnx_path, load_external_data=False)
        locations = external_locations(model)
    except Exception:  # not an ONNX model after all, or an entry onnx refuses: the compile says why
        return ()
    folder = os.path.realpath(os.path.dirname(onnx_path))
    found = set()
    for location in locations:
        try:
            path = os.path.realpath(os.path.join(folder, location))
        except ValueError:  # (a NUL in the name: the compile says why)
            continue
        if os.path.dirname(path) == folder or path.startswith(folder + os.sep):
            found.add(path)
    return tuple(sorted(found))


def _has_marker(onnx_path: str) -> bool:
    try:
        with open_regular(onnx_path) as f:
            tail = b""
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                if _MARKER in tail + chunk[:len(_MARKER)] or _MARKER in chunk:
                    return True
                tail = chunk[-len(_MARKER):]
    except OSError:
        return False
    return False
