"""The model file a version loaded, kept open so that a rebuild can still read it once its path
holds another file (a replacement that failed to load, a compile-cache entry another replica
retired, the file moved away).

The ACL loads models by path, and CANN resolves that path first (GE's RealPath), which fails
for /proc/self/fd/N of a file no folder holds any more: so a rebuild gets a private copy, made
through the descriptor into the temp folder, loaded from there and deleted (`copy_out`; a copy
a process left behind, killed during a rebuild, is deleted by the next copy made there).
The kept file is judged unchanged by its whole identity while its path still holds it; once the
path holds another file or none, by device, inode, size and mtime (ns): its ctime moved when it
was renamed or unlinked, which changes nothing in it (a rewrite in place that keeps the size and
sets the mtime back to the nanosecond, then a rename over it or a delete, is not told; a chmod
or a new hard link while the path holds it fails the rebuild, as a rewrite would). Each one is a
descriptor of the process's, as many kept as descriptor_shares.py gives places for (at most 256, and
what the descriptor limit leaves them beside the connections); past that a version rebuilds from its
path only. Owned by its InstanceBuilder; close() lets it go (the pool's close).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading

from ..descriptor_shares import give_back_model_file, take_model_file
from ..regular_files import open_regular
from ..temp_claims import claimed, sweep_unclaimed

_COPY_CHUNK = 1 << 20
_PREFIX = "aclserve-rebuild-"


def identity_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What the repository watches a model file by (ctime catches a rewrite that restores mtime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeptFile:
    def __init__(self, file, path: str, identity: tuple):
        self._file, self._path, self._identity = file, path, identity
        self._lock = threading.Lock()  # copy_out against close()

    @classmethod
    def open(cls, path: str, identity: tuple) -> "KeptFile | None":
        """The file at `path` kept open when it is the one of `identity` (else, or with no place
        for it in descriptor_shares.py, or on any OSError: None). Never blocks on a FIFO swapped in
        (regular_files)."""
        if not take_model_file():
            return None
        try:
            file = open_regular(path, "rb")
        except OSError:
            give_back_model_file()
            return None
        kept = cls(file, path, identity)
        if not kept.unchanged():
            kept.close()  # (gives its place back)
            return None
        return kept

    def unchanged(self) -> bool:
        with self._lock:
            return self._file is not None and self._same()

    def _same(self) -> bool:
        kept = identity_of(os.fstat(self._file.fileno()))
        if kept == self._identity:
            return True
        if kept[:4] != self._identity[:4]:
            return False
        try:  # only the ctime moved: told apart from a rewrite in place that set the mtime back
            at_path = identity_of(os.stat(self._path))
        except OSError:
            return True  # unlinked, moved away
        return at_path[:2] != kept[:2]  # the path holds another file: renamed over, not rewritten

    @contextlib.contextmanager
    def copy_out(self, name: str):
        """A temp file holding the kept file's bytes, for the with-block (deleted after it), or
        RuntimeError: closed, changed before or while it was copied, or the copy failed (a full
        disk). The copy is locked (flock) while it lives: another process sweeping stale copies
        (_delete_stale_copies) leaves it, whatever its pid means there."""
        _delete_stale_copies()
        with self._lock:
            if self._file is None or not self._same():
                raise RuntimeError("the file this version loaded changed since")
            fd = os.dup(self._file.fileno())  # (sendfile from an offset: no shared offset disturbed)
        try:
            handle, temp = tempfile.mkstemp(prefix=f"{_PREFIX}{name}-", suffix=".om")
        except OSError as e:
            os.close(fd)
            raise RuntimeError(f"copying the file this version loaded for a rebuild failed: "
                               f"{e.strerror or e}") from None
        try:
            if not claimed(handle):  # swept by another process before it was locked
                raise RuntimeError("the rebuild's copy was deleted as it was made; trying again")
            try:
                offset = 0
                while sent := os.sendfile(handle, fd, offset, _COPY_CHUNK):
                    offset += sent
            except OSError as e:
                raise RuntimeError(f"copying the file this version loaded for a rebuild failed: "
                                   f"{e.strerror or e}") from None
            finally:
                os.close(fd)
            with self._lock:
                if self._file is None or not self._same():
                    raise RuntimeError("the file this version loaded changed while it was copied")
            yield temp
        finally:
            with contextlib.suppress(OSError):  # (gone already: a loaded instance must not fail for it)
                os.unlink(temp)
            os.close(handle)  # (the lock goes with it)

    def close(self) -> None:
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()
            give_back_model_file()


def _delete_stale_copies() -> None:
    """Copies left by processes killed while a rebuild loaded one: those no process holds locked."""
    sweep_unclaimed(_PREFIX, ".om", lambda path: path, _delete_copy)


def _delete_copy(path: str) -> bool:
    os.unlink(path)
    return True
