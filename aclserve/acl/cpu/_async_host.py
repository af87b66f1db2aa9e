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
  stricter than a device, which gives wrong data silently.

A memset_async of malloc_host memory owns it as a D2H copy owns its destination: poisoned as its
stream takes it, and failed (107000) if written before it ran.

A copy whose host span overlaps (shares a byte with) the host span of an async task still pending
(H2D: its source; D2H: its destination; a memset: its memory; pending: its stream has not yet got
past it) gets neither poison nor check: the streams' order may make that well defined on a device
(an H2D from A then a D2H back into A on one stream; a bounce, D2H into B then H2D from B; a host
buffer zeroed, then sent), where the later copy's poison or data would fail the earlier one's
check, or its snapshot, taken before the earlier one ran, its own: false alarms. A true race (the
two on streams nothing orders) is still caught by the earlier copy's own check when the later copy
runs first. Poison and
snapshot are taken as the stream takes the copy (a refused call touches nothing), under the
memory's hold (_memory.use): a free_host meanwhile leaves the memory mapped until they are done,
and one before fails the copy as it runs (107000). A stream's spans go when it is destroyed (the
host may free and reuse that memory; a task of it that never ends kept them, and the stream, for
good) and its dropped copies' when it is aborted (`forget`).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Callable

from .. import constants as C
from . import _memory

POISON = 0xFF
# libc's memcmp: compares in place (bytes would copy the span first, a bytes.lstrip scans a byte at a time)
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes, _memcmp.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
H2D, D2H = C.ACL_MEMCPY_HOST_TO_DEVICE, C.ACL_MEMCPY_DEVICE_TO_HOST

_lock = threading.Lock()  # _pending (taken under a stream's lock; takes no other lock itself)
# (start, end, stream, task number) of each host span of a copy or memset taken, pruned once its stream ran it
# (or dropped once it was destroyed, or aborted before running it: forget)
_pending: list[tuple[int, int, object, int]] = []
# what the ERROR line and the error message say of a task whose host side was written before it ran
WRITTEN_SOURCE = "host source of an async copy written before the copy ran"
WRITTEN_DESTINATION = "host destination of an async copy written before the copy ran"
WRITTEN_MEMSET = "host memory of an async memset written before the memset ran"


class HostSide:
    """One memcpy_async's (or memset_async's) host side, under ACLSERVE_CPU_CHECK_HOST: taken() as
    its stream takes the task (Stream.enqueue's `taken`), untouched() as the task runs. `source`:
    the task reads it (an H2D copy's: a snapshot), else writes it (poison); `written`: what a write
    before the task ran is said as."""

    __slots__ = ("ptr", "count", "source", "written", "stream", "_expect")

    def __init__(self, ptr: int, count: int, source: bool, written: str, stream):
        self.ptr, self.count, self.source, self.written, self.stream = ptr, count, source, written, stream
        self._expect: Callable[[], str | None] | None = None  # None: not checked

    def taken(self, number: int) -> None:
        """The task is `number` of its stream: poison its host span (a D2H copy's, a memset's) or
        snapshot it (an H2D copy's), unless it overlaps the span of a task still pending."""
        end = self.ptr + self.count
        with _lock:
            _pending[:] = [p for p in _pending if not p[2].ran(p[3])]
            shared = any(start < end and self.ptr < stop for start, stop, _, _ in _pending)
            _pending.append((self.ptr, end, self.stream, number))
        if shared:
            return
        held = _memory.use(None, (), [(self.ptr, self.count)])
        if held is None:  # freed since the call's checks: the copy's run fails (107000)
            return
        with held:
            self._expect = _expectation(self.ptr, self.count, self.source, self.written)

    def untouched(self) -> str | None:
        """As the task runs (its memory held): what wrote its host side since the call, or None."""
        return self._expect and self._expect()


def host_side(dst: int, src: int, count: int, kind: int, stream) -> HostSide | None:
    """The host side of a copy of the resolved `kind` on `stream` (a Stream); None without one."""
    if kind == H2D:
        return HostSide(src, count, True, WRITTEN_SOURCE, stream)
    if kind == D2H:
        return HostSide(dst, count, False, WRITTEN_DESTINATION, stream)
    return None


def memset_side(ptr: int, count: int, stream) -> HostSide:
    """The host side of a memset_async of malloc_host memory on `stream`: what it writes."""
    return HostSide(ptr, count, False, WRITTEN_MEMSET, stream)


def forget(stream, first: int = 1, last: int | None = None) -> None:
    """The host spans of `stream`'s tasks `first` to `last` (None: all) pend no more: it was
    destroyed (a task of it that never ended kept its spans, unchecked, and the stream, for good),
    or aborted (the tasks it dropped never run)."""
    if not _pending:  # (none taken: the check is off, or every copy ran and was pruned)
        return
    with _lock:
        _pending[:] = [p for p in _pending
                       if p[2] is not stream or p[3] < first or (last is not None and p[3] > last)]


def _expectation(ptr: int, count: int, source: bool, written: str) -> Callable[[], str | None]:
    """Taken as the stream takes the task: a source's snapshot, a destination's poison; what
    checks, as the task runs, that its host side was not written since."""
    if source:
        snapshot = ctypes.string_at(ptr, count)
        return lambda: None if not _memcmp(ptr, snapshot, count) else written
    ctypes.memset(ptr, POISON, count)
    return lambda: None if _all_poison(ptr, count) else written


def _all_poison(ptr: int, count: int) -> bool:
    """Whether the `count` bytes at `ptr` are all POISON: the first is, and each equals the next."""
    return ctypes.c_ubyte.from_address(ptr).value == POISON and not _memcmp(ptr, ptr + 1, count - 1)
