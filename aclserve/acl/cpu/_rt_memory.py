"""acl.rt memory calls (re-exported by rt.py).

A copy checks its pointers (not null), then its kind, then its count, a memset its pointer then
its count, as the earlier versions of CANN's runtime do (hicann/runtime
src/acl/aclrt_impl/memory.cpp: aclrtMemcpyImpl and aclrtMemcpyAsyncImpl check dst, src and the
kind, aclrtMemsetImpl and aclrtMemsetAsyncImpl devPtr, each with 100000, ACL_ERROR_INVALID_PARAM;
rtMemcpy and rtMemcpyAsync then return success for a count of 0): a zero count is a no-op only
past those checks. Its latest version returns success for a zero count before any check; the
CPU runtime keeps the stricter order, so that a program that passes here passes on both.

A copy or memset is checked at the call and again as it runs: one queued on a stream finds its
memory as it is then, and memory freed in between fails the task (107000, the code the call gives
for memory that is not an allocation, at the next synchronize) instead of being touched. While it
runs it holds its memory (_memory.use): a free meanwhile unmaps it only once the task is done.
Its host side belongs to the copy from the call until it completes (_async_host.py): with
ACLSERVE_CPU_CHECK_HOST a D2H destination is poisoned as its stream takes it, and a copy whose
host side was written before it ran fails.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Callable

from .. import constants as C
from . import _async_host, _copy, _err_msg, _memory, _state, faults
from ._args import INT, PTR, api

log = logging.getLogger("aclserve.acl.cpu")
_OK = C.ACL_SUCCESS


# -- memory --------------------------------------------------------------------------------------
@api("acl.rt.malloc", PTR, INT)
def malloc(size, policy):
    ctx, ret = _state.current()
    return (0, ret) if ret else _memory.malloc(ctx.device, size, policy)


@api("acl.rt.malloc_align32", PTR, INT)
def malloc_align32(size, policy):
    """malloc's rounding up to 32 without its 32-byte pad."""
    ctx, ret = _state.current()
    return (0, ret) if ret else _memory.malloc(ctx.device, size, policy, padded=False)


@api("acl.rt.free", PTR)
def free(dev_ptr):
    """Needs no current context (CANN's DevFree falls back to the driver without one)."""
    return _state.check_init() or _memory.free(dev_ptr)


@api("acl.rt.malloc_host", PTR)
def malloc_host(size):
    ctx, ret = _state.current()
    return (0, ret) if ret else _memory.malloc_host(size)


@api("acl.rt.free_host", PTR)
def free_host(host_ptr):
    """Needs no current context (CANN's HostFree falls back to the driver without one, as DevFree)."""
    return _state.check_init() or _memory.free_host(host_ptr)


@api("acl.rt.memcpy", PTR, PTR, PTR, PTR, INT)
def memcpy(dst, dst_max, src, count, kind):
    ctx, ret = _state.current()
    ret = ret or _copy.check_pointers_and_kind(dst, src, kind)
    if ret or count == 0:  # count 0: a no-op once the pointers and the kind pass
        return ret
    kind, ret = _copy.check_memcpy(dst, dst_max, src, count, kind, ctx.device)
    if ret:
        return ret
    return _copy_now(dst, src, count, kind, ctx.device, pinned=False)


def _copy_now(dst: int, src: int, count: int, kind: int, device: int, pinned: bool,
              untouched: Callable[[], str | None] | None = None) -> int:
    """The copy itself, its device sides (and host sides, `pinned`: malloc_host's, as
    memcpy_async's are) held while it runs, unless an injected memcpy fault (faults.py) fails or
    delays it (or fails `device` as a whole), or `untouched` (_async_host.HostSide's: after the
    fault's delay, which widens the window it looks at) finds its host side written since the call."""
    on_device, on_host = _copy.spans(dst, src, count, kind)
    held = _memory.use(device, on_device, on_host if pinned else ())
    if held is None:
        log.error("memcpy of %d bytes from %#x to %#x: its memory was freed before the copy ran", count, src, dst)
        return C.ACL_ERROR_RT_PARAM_INVALID
    with held:
        code = faults.trigger("memcpy", -1, device)
        if code:
            return code
        touched = untouched and untouched()
        if touched:
            return _host_side_written(f"memcpy_async of {count} bytes", f"from {src:#x} to {dst:#x}", touched,
                                      "it belongs to the copy until the copy has completed; a device copies "
                                      "whatever is there when it runs")
        ctypes.memmove(dst, src, count)
    return _OK


def _set_now(dev_ptr: int, value: int, count: int, device: int,
             untouched: Callable[[], str | None] | None = None) -> int:
    """The memset itself, its memory (the device's, or malloc_host's) held while it runs, unless
    `untouched` (an async one's _async_host.HostSide's) finds its host memory written since the call."""
    held = _memory.use(device, *_copy.memset_spans(dev_ptr, count))
    if held is None:
        log.error("memset of %d bytes at %#x: its memory was freed before the memset ran", count, dev_ptr)
        return C.ACL_ERROR_RT_PARAM_INVALID
    with held:
        touched = untouched and untouched()
        if touched:
            return _host_side_written(f"memset_async of {count} bytes", f"at {dev_ptr:#x}", touched,
                                      "it belongs to the memset until the memset has completed; a device "
                                      "writes it whenever the stream gets there")
        ctypes.memset(dev_ptr, value & 0xFF, count)
    return _OK


def _host_side_written(task: str, where: str, touched: str, why: str) -> int:
    """107000 for an async `task` whose host side was written between its call and its run
    (`touched`: what _async_host found), said in an ERROR line and as the device's message."""
    log.error("%s %s: %s (%s)", task, where, touched, why)
    _err_msg.report(f"{task}: {touched}")
    return C.ACL_ERROR_RT_PARAM_INVALID


@api("acl.rt.memcpy_async", PTR, PTR, PTR, PTR, INT, PTR)
def memcpy_async(dst, dst_max, src, count, kind, stream):
    ctx, ret = _state.current()
    ret = ret or _copy.check_pointers_and_kind(dst, src, kind)
    if ret or count == 0:  # count 0: a no-op once the pointers and the kind pass, before the stream's
        return ret
    kind, ret = _copy.check_memcpy(dst, dst_max, src, count, kind, ctx.device)
    if ret:
        return ret
    if kind == C.ACL_MEMCPY_HOST_TO_HOST:
        return C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    ret = _copy.check_async_sides(dst, src, count, kind)
    if ret:
        return ret
    s, ret = _state.stream_of(stream, ctx)
    if ret:
        return ret
    side = _async_host.host_side(dst, src, count, kind, s) if _state.check_host else None  # (None: unchecked)
    return s.enqueue(lambda: _copy_now(dst, src, count, kind, ctx.device, True, side and side.untouched),
                     taken=side and side.taken)


@api("acl.rt.memset", PTR, PTR, INT, PTR)
def memset(dev_ptr, max_size, value, count):
    ctx, ret = _state.current()
    ret = ret or (_OK if dev_ptr else C.ACL_ERROR_INVALID_PARAM)
    if ret or count == 0:  # count 0: a no-op once the pointer passes
        return ret
    ret = _copy.check_memset(dev_ptr, max_size, count, ctx.device)
    return ret or _set_now(dev_ptr, value, count, ctx.device)


@api("acl.rt.memset_async", PTR, PTR, INT, PTR, PTR)
def memset_async(dev_ptr, max_size, value, count, stream):
    ctx, ret = _state.current()
    ret = ret or (_OK if dev_ptr else C.ACL_ERROR_INVALID_PARAM)
    if ret or count == 0:  # count 0: a no-op once the pointer passes, before the stream's check
        return ret
    ret = _copy.check_memset(dev_ptr, max_size, count, ctx.device)
    if ret:
        return ret
    s, ret = _state.stream_of(stream, ctx)
    if ret:
        return ret
    # (malloc_host memory is the memset's until it ran, as a D2H copy's destination: checked alike)
    side = _async_host.memset_side(dev_ptr, count, s) if _state.check_host and _memory.pinned(dev_ptr, count) else None
    return s.enqueue(lambda: _set_now(dev_ptr, value, count, ctx.device, side and side.untouched),
                     taken=side and side.taken)


@api("acl.rt.get_mem_info", INT)
def get_mem_info(attr):
    ctx, ret = _state.current()
    if ret:
        return 0, 0, ret
    if not 0 <= attr <= 10:
        return 0, 0, C.ACL_ERROR_INVALID_PARAM
    code = faults.trigger("mem_info", 0)
    if code:
        return 0, 0, code
    free_bytes, total = _memory.mem_info(ctx.device)
    return free_bytes, total, _OK
