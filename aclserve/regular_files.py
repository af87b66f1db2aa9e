"""Reading a file that must be a regular file without ever blocking on what stands in its place.

The models folder and the compile cache are written by others. A FIFO opened for reading waits
for a writer (a scan stuck there stops every reload), a socket cannot be opened, a device
node's open may act on the device. `open_regular` stats first, so such a node is refused
unopened; opens with O_NONBLOCK, so a FIFO swapped in after the stat cannot block the open;
then checks that what it opened is a regular file (whose reads O_NONBLOCK does not change). The
cost over a plain open is one stat and one fstat. NotRegularFile is an OSError: callers that
report `strerror` name what was found. And `stat_identity`: whether such a file may have changed;
`missing`: whether one is known to be gone.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import IO

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device node"), (stat.S_ISBLK, "a device node"),
          (stat.S_ISLNK, "a symbolic link"))  # (an lstat's: check_regular not following links)


class NotRegularFile(OSError):
    """The path is a FIFO, socket, device node or folder; `strerror` says which."""

    def __init__(self, filename: str | os.PathLike, kind: str):
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file", os.fspath(filename))
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.filename} {self.strerror}"


def node_kind(mode: int) -> str | None:
    """None for a regular file, else what it is ("a FIFO", "a socket", "a device node", "a folder")."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for is_kind, kind in _KINDS if is_kind(mode)), "not a regular file")


def check_regular(path: str | os.PathLike, follow_links: bool = True) -> os.stat_result:
    """The stat of `path` (symlinks followed unless `follow_links` is False: a link is then
    NotRegularFile), or NotRegularFile / the OSError of the stat."""
    st = os.stat(path) if follow_links else os.lstat(path)
    kind = node_kind(st.st_mode)
    if kind is not None:
        raise NotRegularFile(path, kind)
    return st


def stat_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode) of a file's stat: changed whenever its content may have.
    Size and mtime alone miss a file replaced by one of the same size whose mtime was set back
    (tar, cp -p, reproducible builds); the inode and the ctime, which no one sets, catch it."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def missing(path: str | os.PathLike) -> bool:
    """`path` does not exist (one stat); a stat refused for another reason (permissions, a folder on
    the way that cannot be searched) tells nothing: the file may be there."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY)


def _open_nonblocking_unfollowed(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)  # (a link swapped in: ELOOP)


def open_regular(path: str | os.PathLike, mode: str = "rb", encoding: str | None = None,
                 follow_links: bool = True) -> IO:
    """`open(path, mode, encoding=...)` for reading, refusing anything but a regular file
    (NotRegularFile) without blocking; with `follow_links` False a symbolic link too (the compile
    cache's files: a link there would have the server read a file elsewhere as its own). The file
    object's `name` is `path`, as with open()."""
    check_regular(path, follow_links)
    opener = _open_nonblocking if follow_links else _open_nonblocking_unfollowed
    f = open(path, mode, encoding=encoding, opener=opener)
    try:
        kind = node_kind(os.fstat(f.fileno()).st_mode)  # swapped between the stat and the open
        if kind is not None:
            raise NotRegularFile(path, kind)
    except BaseException:
        f.close()
        raise
    return f
