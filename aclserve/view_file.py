"""A picture's bytes as a file for Pillow without a copy of them: io.BytesIO shares a bytes
object's buffer but copies anything else whole (a memoryview into a request body: a 42 MB picture
held 42 MB more, uncharged; found by tester t88). The Pillow decoder (images/decode.py) reads
request bodies so, and the CPU runtime's JPEGD (acl/cpu/_dvpp.py) DVPP memory, as a chip reads it.
"""
from __future__ import annotations

import io


def as_file(data: bytes | memoryview):
    """`data` as a read-only file, not copied (each read copies only what it returns)."""
    return io.BytesIO(data) if isinstance(data, bytes) else ViewFile(data)


class ViewFile(io.RawIOBase):
    """A read-only file over a memoryview (or any buffer of bytes): each read copies only what it returns."""

    def __init__(self, view):
        super().__init__()
        self._view, self._pos = memoryview(view).cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else self._pos + size
        part = bytes(self._view[self._pos:end])
        self._pos += len(part)
        return part

    def readinto(self, buffer) -> int:
        part = self._view[self._pos:self._pos + len(buffer)]
        buffer[:len(part)] = part
        self._pos += len(part)
        return len(part)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos
