"""memcpy/memset checks: device sides inside one allocation of the device (on the board, run mode
ACL_DEVICE, malloc_host's memory is the device's: _memory.addressable), host sides outside all
device memory; a memset's memory one allocation of the device or of malloc_host."""
from __future__ import annotations

from .. import constants as C
from . import _memory

H2H, H2D, D2H, D2D, DEFAULT = (C.ACL_MEMCPY_HOST_TO_HOST, C.ACL_MEMCPY_HOST_TO_DEVICE,
                               C.ACL_MEMCPY_DEVICE_TO_HOST, C.ACL_MEMCPY_DEVICE_TO_DEVICE,
                               C.ACL_MEMCPY_DEFAULT)


def _side_ok(ptr: int, count: int, on_device: bool, device: int) -> bool:
    if on_device:
        return _memory.addressable(ptr, count, device)
    return not _memory.touches_device(ptr, count)


def check_pointers_and_kind(dst: int, src: int, kind: int) -> int:
    """What aclrtMemcpy and aclrtMemcpyAsync check before the count, a zero one included: dst and
    src not null, then the kind (ACL_ERROR_INVALID_PARAM)."""
    return C.ACL_SUCCESS if dst and src and H2H <= kind <= DEFAULT else C.ACL_ERROR_INVALID_PARAM


def check_memcpy(dst: int, dst_max: int, src: int, count: int, kind: int, device: int) -> tuple[int, int]:
    """(resolved kind, ret) for a copy of count > 0 bytes under `device`."""
    if check_pointers_and_kind(dst, src, kind) or count < 0 or dst_max < 0:
        return kind, C.ACL_ERROR_INVALID_PARAM
    if count > dst_max:
        return kind, C.ACL_ERROR_RT_PARAM_INVALID
    if kind == DEFAULT:
        dst_dev, src_dev = _memory.touches_device(dst, count), _memory.touches_device(src, count)
        kind = (D2D if src_dev else H2D) if dst_dev else (D2H if src_dev else H2H)
    else:
        dst_dev, src_dev = kind in (H2D, D2D), kind in (D2H, D2D)
    if not (_side_ok(dst, count, dst_dev, device) and _side_ok(src, count, src_dev, device)):
        return kind, C.ACL_ERROR_RT_PARAM_INVALID
    return kind, C.ACL_SUCCESS


ASYNC_ALIGN = 64  # memcpy_async's addresses (CANN docs)


def check_async_sides(dst: int, src: int, count: int, kind: int) -> int:
    """What memcpy_async asks beyond memcpy's checks (CANN 8.x docs): both addresses 64-byte
    aligned, and the host side in malloc_host memory. The device does not refuse either (it
    copies wrongly, or not in stream order): refused here, so the mistake shows before a device
    runs it."""
    if dst % ASYNC_ALIGN or src % ASYNC_ALIGN:
        return C.ACL_ERROR_RT_PARAM_INVALID
    host = dst if kind == D2H else src if kind == H2D else None
    if host is not None and not _memory.pinned(host, count):
        return C.ACL_ERROR_RT_PARAM_INVALID
    return C.ACL_SUCCESS


def spans(dst: int, src: int, count: int, kind: int) -> tuple[list, list]:
    """(device spans, host spans) of a copy of the resolved `kind`, as _memory.use takes them."""
    on_device, on_host = [], []
    for ptr, device_side in ((dst, kind in (H2D, D2D)), (src, kind in (D2H, D2D))):
        (on_device if device_side else on_host).append((ptr, count))
    return on_device, on_host


def check_memset(dev: int, max_size: int, count: int, device: int) -> int:
    """CANN's aclrtMemset and aclrtMemsetAsync pages: the memory is the device's or the host's, told
    apart by its address; host memory not from an acl call (aclrtMallocHost) is undefined
    behaviour there, refused here."""
    if dev == 0 or count < 0 or max_size < 0:
        return C.ACL_ERROR_INVALID_PARAM
    if count > max_size or not (_side_ok(dev, count, True, device) or _memory.pinned(dev, count)):
        return C.ACL_ERROR_RT_PARAM_INVALID
    return C.ACL_SUCCESS


def memset_spans(dev: int, count: int) -> tuple[list, list]:
    """(device spans, host spans) of a memset check_memset took, as _memory.use takes them."""
    span = [(dev, count)]
    return ([], span) if _memory.pinned(dev, count) else (span, [])
