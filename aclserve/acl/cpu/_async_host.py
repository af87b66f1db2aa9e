"""The host side of a memcpy_async belongs to the copy from the call until the copy has completed
(an event recorded after it, or its stream, synchronized): on a device the DMA reads an H2D
copy's source, and writes a D2H copy's destination, whenever the stream gets there. A host that
writes the source before then sends whatever is there by that time; one that reads the
destination before then reads stale or partial bytes; neither fails on a device. The CPU
runtime's streams run each task as soon as they can, so such a bug passed every test here and
gave wrong answers on a device. So, with ACLSERVE_CPU_CHECK_HOST=1 (settings.check_host; off,
the default, memcpy_async does none of this: a checker mode, which the test suite runs in):

- a D2H copy's host destination is filled with POISON at the call (NaN as a float, -1 as an int;
  0xFF is True / 255 as a BOOL / UINT8, plausible there), as the stream takes the copy: a read
  before the copy ran sees poison, not plausible stale data. A copy taken then dropped (an abort,
  a stopped context, an injected fault) leaves the poison where a device leaves the old bytes;
- the copy's run checks that its host side was not written since the call: an H2D source against
  a copy of its bytes taken at the call, a D2H destination still all POISON. A write fails that
  copy (107000, as a copy whose memory was freed under it) with an ERROR line saying which:
  stricter than a device, which gives wrong data silently. A host buffer given to a second async
  copy before the first completed counts as written (the second's D2H poison, or its data); on a
  device the streams' order may make that well defined.
"""
from __future__ import annotations

import ctypes
from typing import Callable

from .. import constants as C

POISON = 0xFF
# libc's memcmp: compares in place (bytes would copy the span first, a bytes.lstrip scans a byte at a time)
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes, _memcmp.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
H2D, D2H = C.ACL_MEMCPY_HOST_TO_DEVICE, C.ACL_MEMCPY_DEVICE_TO_HOST


def poisoner(dst: int, count: int, kind: int) -> Callable[[], None] | None:
    """What fills a D2H copy's destination with POISON as its stream takes it (Stream.enqueue's
    `taken`: a call refused touches nothing); None for other kinds."""
    if kind != D2H:
        return None
    return lambda: ctypes.memset(dst, POISON, count)


def expectation(dst: int, src: int, count: int, kind: int) -> Callable[[], str | None] | None:
    """At the call (ACLSERVE_CPU_CHECK_HOST): what checks, as the copy runs, that its host side
    was not written since; it answers what happened, or None. None for a copy without a host side."""
    if kind == H2D:
        snapshot = ctypes.string_at(src, count)
        return lambda: None if not _memcmp(src, snapshot, count) else (
            "host source of an async copy written before the copy ran")
    if kind == D2H:
        return lambda: None if _all_poison(dst, count) else (
            "host destination of an async copy written before the copy ran")
    return None


def _all_poison(ptr: int, count: int) -> bool:
    """Whether the `count` bytes at `ptr` are all POISON: the first is, and each equals the next."""
    return ctypes.c_ubyte.from_address(ptr).value == POISON and not _memcmp(ptr, ptr + 1, count - 1)
