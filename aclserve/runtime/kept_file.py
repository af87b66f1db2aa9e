"""The model file a version loaded, kept open so that a rebuild can still read it once its path
holds another file (a replacement that failed to load, a compile-cache entry another replica
retired, the file moved away).

The ACL loads models by path, and CANN resolves that path first (GE's RealPath), which fails
for /proc/self/fd/N of a file no folder holds any more: so a rebuild gets a private copy, made
through the descriptor into the temp folder, loaded from there and deleted (`copy_out`). The
kept file is judged unchanged by device, inode, size and mtime (ns): its ctime moves when it is
renamed, linked or unlinked, which changes nothing in it; a rewrite in place that keeps the size
and sets the mtime back to the nanosecond is not told. At most MAX_KEPT are kept in a process
(each one a descriptor of the reserve connections.FD_RESERVE leaves for model files); past
that a version rebuilds from its path only, as before. Owned by its InstanceBuilder; close()
lets it go (the pool's close).
"""
from __future__ import annotations

import os
import tempfile
import threading

from ..regular_files import open_regular

MAX_KEPT = 256  # half of connections.FD_RESERVE
_COPY_CHUNK = 1 << 20
_count_lock = threading.Lock()
_kept = 0


def identity_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What the repository watches a model file by (ctime catches a rewrite that restores mtime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeptFile:
    def __init__(self, file, identity: tuple):
        self._file, self._identity = file, identity
        self._lock = threading.Lock()  # copy_out against close()

    @classmethod
    def open(cls, path: str, identity: tuple) -> "KeptFile | None":
        """The file at `path` kept open when it is the one of `identity` (else, or past MAX_KEPT,
        or on any OSError: None). Never blocks on a FIFO swapped in (regular_files)."""
        global _kept
        with _count_lock:
            if _kept >= MAX_KEPT:
                return None
            _kept += 1
        try:
            file = open_regular(path, "rb")
        except OSError:
            file = None
        kept = cls(file, identity) if file is not None else None
        if kept is None or not kept.unchanged():
            if kept is not None:
                kept.close()
            else:
                _release()
            return None
        return kept

    def unchanged(self) -> bool:
        with self._lock:
            return self._file is not None and self._same()

    def _same(self) -> bool:
        return identity_of(os.fstat(self._file.fileno()))[:4] == self._identity[:4]

    def copy_out(self, prefix: str) -> str:
        """A temp file holding the kept file's bytes (the caller deletes it), or RuntimeError:
        closed, changed before or while it was copied, or the copy failed (a full disk)."""
        with self._lock:
            if self._file is None or not self._same():
                raise RuntimeError("the file this version loaded changed since")
            fd = os.dup(self._file.fileno())  # (read with pread: no shared offset to disturb)
        try:
            handle, temp = tempfile.mkstemp(prefix=prefix, suffix=".om")
            try:
                with os.fdopen(handle, "wb") as out:
                    offset = 0
                    while chunk := os.pread(fd, _COPY_CHUNK, offset):
                        out.write(chunk)
                        offset += len(chunk)
                if identity_of(os.fstat(fd))[:4] != self._identity[:4]:
                    raise RuntimeError("the file this version loaded changed while it was copied")
            except BaseException:
                os.unlink(temp)
                raise
        except OSError as e:
            raise RuntimeError(f"copying the file this version loaded for a rebuild failed: "
                               f"{e.strerror or e}") from None
        finally:
            os.close(fd)
        return temp

    def close(self) -> None:
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()
            _release()


def _release() -> None:
    global _kept
    with _count_lock:
        _kept -= 1
