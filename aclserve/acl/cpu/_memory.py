"""Device and host memory of the CPU runtime: real process memory at real addresses.

Device allocations follow aclrtMalloc: the size is rounded up to a multiple of 32 plus 32 bytes
of pad (aclrtMallocAlign32: without the pad), the start is 64-byte aligned, and each device has a
capacity with a used figure.
Allocations above 1 MiB under HUGE_FIRST/HUGE_ONLY come from an anonymous mapping whose
2 MiB-aligned body is advised MADV_HUGEPAGE (transparent huge pages); `stats()` reports the
bytes advised and the bytes the kernel actually backs with huge pages (_thp.py).

Every allocation is owned by this module until `free`/`free_host`, or `release_all` at
finalize. Lookups (`find`) are what memcpy/execute use to keep pointers inside allocations.
Work that runs later, on a stream or in a loaded model, takes the memory it reads or writes with
`use`, which hands it over in a Held, its one owner, and gives it back with that Held's release
(a `with` block on it): a free meanwhile takes the allocation out of the tables at once (a later
lookup or `use` fails, its bytes count as free) but leaves it mapped until the last user lets go,
so the host process never touches unmapped memory (on a device that is a task's memory fault at
worst, not the end of the process).

On the board (run mode ACL_DEVICE) malloc_host's memory is the device's own normal memory (CANN's
aclrtMallocHost page): `use` and `addressable` take it as device memory there, of any device.
"""
from __future__ import annotations

import bisect
import ctypes
import logging
import mmap
import threading

from .. import constants as C
from . import _thp

log = logging.getLogger("aclserve.acl.cpu")

HUGE_THRESHOLD = 1 << 20
HUGE_PAGE = 2 << 20
_SMALL_LIMIT = 64 << 10  # below this a ctypes buffer is cheaper than a mapping
_HUGE_POLICIES = {C.ACL_MEM_MALLOC_HUGE_FIRST, C.ACL_MEM_MALLOC_HUGE_ONLY,
                  C.ACL_MEM_MALLOC_HUGE_FIRST_P2P, C.ACL_MEM_MALLOC_HUGE_ONLY_P2P, 6, 7}
_HUGE_ONLY_POLICIES = {C.ACL_MEM_MALLOC_HUGE_ONLY, C.ACL_MEM_MALLOC_HUGE_ONLY_P2P, 6, 7}
_KNOWN_FLAGS = 0x100 | 0x1000 | 0x100000


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def alloc_size(size: int, padded: bool = True) -> int:
    """What aclrtMalloc really takes for `size`: round up to 32, add 32; aclrtMallocAlign32 adds no
    pad (`padded` False: hicann/runtime aclrtMallocAlign32Impl, aclMallocMemInner's isPadding)."""
    return _align(size, 32) + (32 if padded else 0)


def _mmap_address(mm: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # release the buffer export so the mapping can be closed later


class Allocation:
    """One block of memory; owns its mapping or ctypes buffer until close()."""

    __slots__ = ("ptr", "size", "device", "huge_advised", "_mm", "_buf", "map_start", "map_len", "charged",
                 "users", "freed")

    def __init__(self, ptr, size, device, mm=None, buf=None, map_start=0, map_len=0, huge_advised=0):
        self.ptr, self.size, self.device = ptr, size, device
        self.charged = size  # what it takes of the device's capacity (malloc: whole huge pages)
        self._mm, self._buf = mm, buf
        self.map_start, self.map_len, self.huge_advised = map_start, map_len, huge_advised
        self.users = 0  # work holding it mapped (use / Held.release), under _lock
        self.freed = False  # freed while in use: unmapped when the last user lets go

    @property
    def end(self) -> int:
        return self.ptr + self.size

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._mm = self._buf = None


class DeviceMemory:
    __slots__ = ("device", "total", "used", "huge_advised_bytes")

    def __init__(self, device: int, total: int):
        self.device, self.total, self.used, self.huge_advised_bytes = device, total, 0, 0


_lock = threading.Lock()
_starts: list[int] = []
_device_allocs: dict[int, Allocation] = {}
_host_allocs: dict[int, Allocation] = {}
_host_starts: list[int] = []  # sorted keys of _host_allocs
_devices: dict[int, DeviceMemory] = {}


_host_offset = 0  # where malloc_host's blocks start past a page boundary (the board: not 64-aligned)
_host_is_device = False  # the board: malloc_host's memory is device memory


def reset(device_count: int, capacity: int, host_offset: int = 0, host_is_device: bool = False) -> None:
    global _host_offset, _host_is_device
    _host_offset, _host_is_device = host_offset, host_is_device
    with _lock:
        _devices.clear()
        for d in range(device_count):
            _devices[d] = DeviceMemory(d, capacity)


def forget_in_child() -> None:
    """A forked child's ledger: nothing allocated, no device (its init makes them); the parent's
    blocks are dropped, not freed (_state.forget_in_child)."""
    global _lock
    _lock = threading.Lock()
    for registry in (_starts, _device_allocs, _host_allocs, _host_starts, _devices):
        registry.clear()


def release_all() -> int:
    """Free everything (acl.finalize). Returns the number of allocations that were still live."""
    with _lock:
        live = list(_device_allocs.values()) + list(_host_allocs.values())
        _device_allocs.clear()
        _host_allocs.clear()
        _host_starts.clear()
        _starts.clear()
        for mem in _devices.values():
            mem.used = mem.huge_advised_bytes = 0
        idle = _detach(live)
    for a in idle:
        a.close()
    return len(live)


def _detach(allocs) -> list[Allocation]:
    """Of allocations just taken out of the tables (under _lock), those to unmap now; the others
    are in use and unmapped by the last Held.release."""
    idle = []
    for a in allocs:
        if a.users:
            a.freed = True
        else:
            idle.append(a)
    return idle


def _new_mapping(length: int) -> tuple[mmap.mmap, int]:
    mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, _mmap_address(mm)


def _allocate_huge(size: int, device: int, huge_only: bool) -> Allocation | None:
    body = _align(size, HUGE_PAGE)
    if _thp.MODE in ("never", "unavailable"):
        return None
    # Map one huge page more so the body can start on a 2 MiB boundary (THP needs aligned pages).
    mm, base = _new_mapping(body + HUGE_PAGE)
    ptr = _align(base, HUGE_PAGE)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE, ptr - base, body)
    except (OSError, AttributeError, ValueError) as e:
        log.debug("MADV_HUGEPAGE refused (%s)%s", e, "" if huge_only else "; using normal pages")
        mm.close()
        return None
    return Allocation(ptr, size, device, mm=mm, map_start=ptr, map_len=body, huge_advised=body)


def _allocate_normal(size: int, device: int | None) -> Allocation:
    if size < _SMALL_LIMIT:
        buf = ctypes.create_string_buffer(size + 64)
        return Allocation(_align(ctypes.addressof(buf), 64), size, device, buf=buf)
    mm, base = _new_mapping(size)
    return Allocation(base, size, device, mm=mm)


def malloc(device: int, size: int, policy: int, padded: bool = True) -> tuple[int, int]:
    if size <= 0 or policy < 0 or (policy & ~0xff & ~_KNOWN_FLAGS) or (policy & 0xff) > 7:
        return 0, C.ACL_ERROR_INVALID_PARAM
    base_policy = policy & 0xff
    size = alloc_size(size, padded)
    huge = base_policy in _HUGE_POLICIES and size > HUGE_THRESHOLD
    # past 1 MiB a huge-page policy takes whole 2 MiB pages of the device, THP here or not
    # (CANN: "内存申请粒度为2M，不足2M的倍数，向上2M对齐"; get_mem_info's free loses them)
    charge = _align(size, HUGE_PAGE) if huge else size
    mem = _devices[device]
    with _lock:
        if mem.used + charge > mem.total:
            return 0, C.ACL_ERROR_RT_MEMORY_ALLOCATION
        mem.used += charge  # reserve before mapping so concurrent mallocs respect the capacity
    try:
        alloc = None
        if huge:
            alloc = _allocate_huge(size, device, base_policy in _HUGE_ONLY_POLICIES)
            if alloc is None and base_policy in _HUGE_ONLY_POLICIES:
                raise MemoryError("no transparent huge pages for a HUGE_ONLY allocation")
        if alloc is None:
            alloc = _allocate_normal(size, device)
    except (MemoryError, OSError) as e:
        log.warning("device %d: malloc of %d bytes failed: %s", device, size, e)
        with _lock:
            mem.used -= charge
        return 0, C.ACL_ERROR_RT_MEMORY_ALLOCATION
    alloc.charged = charge
    with _lock:
        mem.huge_advised_bytes += alloc.huge_advised
        _device_allocs[alloc.ptr] = alloc
        bisect.insort(_starts, alloc.ptr)
    return alloc.ptr, C.ACL_SUCCESS


def free(ptr: int) -> int:
    if ptr == 0:
        return C.ACL_ERROR_INVALID_PARAM
    with _lock:
        alloc = _device_allocs.pop(ptr, None)
        if alloc is None:
            return C.ACL_ERROR_RT_PARAM_INVALID
        del _starts[bisect.bisect_left(_starts, ptr)]
        mem = _devices.get(alloc.device)
        if mem is not None:
            mem.used -= alloc.charged
            mem.huge_advised_bytes -= alloc.huge_advised
        idle = _detach([alloc])
    for a in idle:
        a.close()
    return C.ACL_SUCCESS


def _holding(starts: list[int], allocs: dict[int, Allocation], ptr: int, length: int) -> Allocation | None:
    """The allocation of `allocs` (`starts`: their sorted addresses) holding [ptr, ptr+length),
    or None (also when it straddles an end)."""
    with _lock:
        return _holding_locked(starts, allocs, ptr, length)


def _holding_locked(starts, allocs, ptr: int, length: int) -> Allocation | None:
    i = bisect.bisect_right(starts, ptr) - 1
    if i < 0:
        return None
    alloc = allocs[starts[i]]
    return alloc if ptr + max(length, 1) <= alloc.end else None


class Held(list):
    """The allocations use() took, in its order, each kept mapped until release() or the end of a
    `with` block on it, whichever comes first: their one owner, whose release gives them back once
    (a second finds nothing). A list, as use() gave before; held this way a task's memory costs
    about 1 us more than a try/finally around a let_go function did (under 1 % of a batch)."""

    __slots__ = ()

    def release(self, *_exc) -> None:
        """Give back what use() took; an allocation freed meanwhile is unmapped now."""
        with _lock:  # (two threads releasing it at once: the second finds nothing)
            idle = []
            for a in self:
                a.users -= 1
                if not a.users and a.freed:
                    idle.append(a)
            self.clear()
        for a in idle:
            a.close()

    def __enter__(self) -> "Held":
        return self

    __exit__ = release


def _device_side_locked(ptr: int, length: int, device: int | None) -> Allocation | None:
    """The allocation holding [ptr, ptr+length) that `device` (None: any) addresses as its memory:
    its malloc's, and on the board malloc_host's (of no device: any device's there)."""
    alloc = _holding_locked(_starts, _device_allocs, ptr, length)
    if alloc is None and _host_is_device:
        alloc = _holding_locked(_host_starts, _host_allocs, ptr, length)
    if alloc is None or (device is not None and alloc.device not in (device, None)):
        return None
    return alloc


def addressable(ptr: int, length: int, device: int | None) -> bool:
    """Whether [ptr, ptr+length) lies in one allocation `device` (None: any) addresses as its own
    memory: its malloc's, and on the board (ACL_DEVICE) malloc_host's as well."""
    with _lock:
        return _device_side_locked(ptr, length, device) is not None


def use(device: int | None, device_spans=(), host_spans=()) -> Held | None:
    """The allocations holding each (ptr, length) of `device_spans` in device memory (of `device`;
    None: of any device; on the board malloc_host's too) and of `host_spans` in malloc_host memory,
    in that order, each kept mapped until the Held they come in is released (a free meanwhile
    unmaps it only then). None, and nothing taken, when a span is not (any more) in such an
    allocation."""
    with _lock:
        taken = Held([_device_side_locked(ptr, length, device) for ptr, length in device_spans])
        if None in taken:
            return None
        taken += [_holding_locked(_host_starts, _host_allocs, ptr, length) for ptr, length in host_spans]
        if None in taken:
            return None
        for a in taken:
            a.users += 1
    return taken


def find(ptr: int, length: int) -> Allocation | None:
    """The device allocation holding [ptr, ptr+length), or None (also when it straddles an end)."""
    return _holding(_starts, _device_allocs, ptr, length)


def touches_device(ptr: int, length: int) -> bool:
    """Whether [ptr, ptr+length) overlaps any device allocation."""
    with _lock:
        i = bisect.bisect_right(_starts, ptr + max(length, 1) - 1) - 1
        if i < 0:
            return False
        return _device_allocs[_starts[i]].end > ptr


def pinned(ptr: int, length: int) -> bool:
    """Whether [ptr, ptr+length) lies in one malloc_host allocation."""
    return _holding(_host_starts, _host_allocs, ptr, length) is not None


def malloc_host(size: int) -> tuple[int, int]:
    if size <= 0:
        return 0, C.ACL_ERROR_INVALID_PARAM
    try:
        mm, base = _new_mapping(_align(size + _host_offset, mmap.PAGESIZE))
    except (MemoryError, OSError, OverflowError):  # (past 2**63 bytes mmap cannot even be asked)
        return 0, C.ACL_ERROR_BAD_ALLOC
    ptr = base + _host_offset
    with _lock:
        _host_allocs[ptr] = Allocation(ptr, size, None, mm=mm)
        bisect.insort(_host_starts, ptr)
    return ptr, C.ACL_SUCCESS


def free_host(ptr: int) -> int:
    if ptr == 0:
        return C.ACL_ERROR_INVALID_PARAM
    with _lock:
        alloc = _host_allocs.pop(ptr, None)
        if alloc is None:
            return C.ACL_ERROR_RT_PARAM_INVALID
        del _host_starts[bisect.bisect_left(_host_starts, ptr)]
        idle = _detach([alloc])
    for a in idle:
        a.close()
    return C.ACL_SUCCESS


def mem_info(device: int) -> tuple[int, int]:
    mem = _devices[device]
    return mem.total - mem.used, mem.total


def _huge_backed_by_device() -> dict[int, int]:
    with _lock:
        regions = sorted((a.map_start, a.map_start + a.map_len, a.device)
                         for a in _device_allocs.values() if a.huge_advised)
    return _thp.backed(regions)


def stats(device: int) -> dict:
    """used/total/free bytes, huge-page advised and backed bytes, live allocations, host bytes."""
    with _lock:
        mem = _devices.get(device)
        if mem is None:
            raise ValueError(f"no device {device} (is acl initialised?)")
        count = sum(1 for a in _device_allocs.values() if a.device == device)
        out = {"device": device, "total": mem.total, "used": mem.used, "free": mem.total - mem.used,
               "allocations": count, "huge_advised_bytes": mem.huge_advised_bytes,
               "host_used": sum(a.size for a in _host_allocs.values()), "thp_mode": _thp.MODE}
    out["huge_backed_bytes"] = _huge_backed_by_device().get(device, 0)
    return out
