"""The external data files a dropped .onnx names: weights kept beside the graph (exporters
write models over protobuf's 2 GB that way, `model.onnx.data` say). They are part of the model:
the compile cache's key hashes them (compiler.cache_key) and the scan's identity of the version
stamps them (layout.VersionFile), so a re-export that changes only the weights is compiled and
served anew, and a .data file that comes after its .onnx is tried again. Without them a second
version with the same graph and other weights was served with the first one's.

A file is read once per identity (memoized) to look for the bytes an external tensor's
`location` entry is written as; only a file that has them is parsed (without its data). Files
named outside the model's folder are left out: the compile refuses them itself (onnx does).
"""
from __future__ import annotations

import functools
import os

from ..regular_files import open_regular

# a StringStringEntryProto whose key is "location", as onnx writes an external tensor's entry
_MARKER = b"\n\x08location"
_CHUNK = 1 << 20


def named_files(onnx_path: str) -> tuple[str, ...]:
    """The external data files `onnx_path` names (absolute, sorted; not checked to exist)."""
    try:
        st = os.stat(onnx_path)
    except OSError:
        return ()
    return _named(onnx_path, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))


def stamp(onnx_path: str) -> tuple:
    """(path, size, mtime, ctime, inode) of each external data file, (path, None) for one missing."""
    out = []
    for path in named_files(onnx_path):
        try:
            st = os.stat(path)
            out.append((path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        except OSError:
            out.append((path, None))
    return tuple(out)


@functools.lru_cache(maxsize=512)
def _named(onnx_path: str, identity: tuple) -> tuple[str, ...]:
    if not _has_marker(onnx_path):
        return ()
    import onnx  # (heavy: only for a model that names external data)
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    try:
        model = onnx.load(onnx_path, load_external_data=False)
    except Exception:  # not an ONNX model after all: the compile says why
        return ()
    folder = os.path.realpath(os.path.dirname(onnx_path))
    found = set()
    for tensor in _tensors(model.graph):
        if uses_external_data(tensor):
            path = os.path.realpath(os.path.join(folder, ExternalDataInfo(tensor).location))
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


def _tensors(graph):
    """Every tensor of `graph` and its subgraphs: initializers and node attributes."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)
