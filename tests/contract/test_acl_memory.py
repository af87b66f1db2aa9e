"""Device memory: rounding, alignment, capacity, huge pages, host memory, memcpy and memset."""
from __future__ import annotations

import ctypes

import numpy as np

from aclserve.acl import constants as C

H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
MIB = 1 << 20


def _free(acl):
    free, total, ret = acl.rt.get_mem_info(C.ACL_HBM_MEM)
    assert ret == 0 and 0 <= free <= total
    return free


def test_malloc_rounds_to_32_plus_32_and_aligns_to_64(acl, ctx, acl_kind):
    for size in (1, 32, 33, 1000, 3 * MIB + 5):
        before = _free(acl)
        ptr, ret = acl.rt.malloc(size, C.ACL_MEM_MALLOC_NORMAL_ONLY)
        assert ret == 0 and ptr % 64 == 0
        if acl_kind == "cpu":
            assert before - _free(acl) == (size + 31) // 32 * 32 + 32
        assert acl.rt.free(ptr) == 0
        assert _free(acl) == before or acl_kind != "cpu"
    assert acl.rt.malloc(0, 0) == (0, C.ACL_ERROR_INVALID_PARAM)


def test_malloc_align32_rounds_to_32_without_the_pad(acl, ctx, acl_kind):
    """aclrtMallocAlign32 rounds the size up to 32 and adds no pad (hicann/runtime
    src/acl/aclrt_impl/memory.cpp: aclMallocMemInner with isPadding false; pyACL reference, section
    4). The CPU runtime added malloc's 32 bytes, so a copy of 96 bytes into malloc_align32(64) went
    through (found by a fidelity tester): it is past the allocation."""
    for size in (1, 32, 33, 1000):
        before = _free(acl)
        ptr, ret = acl.rt.malloc_align32(size, C.ACL_MEM_MALLOC_NORMAL_ONLY)
        assert ret == 0 and ptr % 64 == 0
        if acl_kind == "cpu":
            assert before - _free(acl) == (size + 31) // 32 * 32
        assert acl.rt.free(ptr) == 0
    data = bytes(96)
    ptr, ret = acl.rt.malloc_align32(64, C.ACL_MEM_MALLOC_NORMAL_ONLY)
    assert ret == 0
    try:
        assert acl.rt.memcpy(ptr, 64, acl.util.bytes_to_ptr(data), 64, H2D) == 0
        if acl_kind == "cpu":  # undefined behaviour on hardware; the CPU runtime checks it
            assert acl.rt.memcpy(ptr, 96, acl.util.bytes_to_ptr(data), 96, H2D) == C.ACL_ERROR_RT_PARAM_INVALID
    finally:
        assert acl.rt.free(ptr) == 0


def test_over_capacity_gives_207001(acl, ctx):
    free, total, _ = acl.rt.get_mem_info(C.ACL_HBM_MEM)
    assert acl.rt.malloc(total + MIB, C.ACL_MEM_MALLOC_HUGE_FIRST) == (0, C.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert _free(acl) == free
    assert acl.rt.get_mem_info(99) == (0, 0, C.ACL_ERROR_INVALID_PARAM)


def test_huge_first_allocations_are_advised_for_huge_pages(acl, ctx, cpu_only):
    stats0 = acl.memory_stats(0)
    ptr, ret = acl.rt.malloc(4 * MIB, C.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0
    small, ret = acl.rt.malloc(MIB - 64, C.ACL_MEM_MALLOC_HUGE_FIRST)  # padded, still <= 1 MiB: normal pages
    assert ret == 0
    ctypes.memset(ptr, 1, 4 * MIB)  # touch it so the kernel can back it
    stats = acl.memory_stats(0)
    # past 1 MiB whole 2 MiB pages, as the device takes them: 4 MiB + 32 takes 6 MiB
    assert stats["used"] - stats0["used"] == 6 * MIB + (MIB - 32)
    if stats["thp_mode"] in ("always", "madvise"):
        assert ptr % (2 * MIB) == 0
        assert stats["huge_advised_bytes"] - stats0["huge_advised_bytes"] >= 4 * MIB + 32
    assert 0 <= stats["huge_backed_bytes"] <= stats["huge_advised_bytes"] + 2 * MIB
    assert acl.rt.free(ptr) == 0 and acl.rt.free(small) == 0
    assert acl.memory_stats(0)["huge_advised_bytes"] == stats0["huge_advised_bytes"]


def test_free_rules(acl, ctx, acl_kind):
    ptr, _ = acl.rt.malloc(128, 0)
    assert acl.rt.free(0) == C.ACL_ERROR_INVALID_PARAM
    if acl_kind == "cpu":  # what a driver answers to these is not documented: not tried on a device
        assert acl.rt.free(ptr + 64) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free(ptr) == 0
    if acl_kind == "cpu":
        assert acl.rt.free(ptr) == C.ACL_ERROR_RT_PARAM_INVALID


def test_host_memory_is_page_aligned_and_separate(acl, ctx, acl_kind):
    before = _free(acl)
    host, ret = acl.rt.malloc_host(100)
    on_board = acl.rt.get_run_mode()[0] == C.ACL_DEVICE  # there the device's normal memory, not page-aligned
    assert ret == 0 and (host % 4096 == 0 or on_board)
    assert _free(acl) == before
    assert acl.rt.free(host) == C.ACL_ERROR_RT_PARAM_INVALID or acl_kind != "cpu"
    assert acl.rt.free_host(host) == 0
    assert acl.rt.free_host(0) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.malloc_host(0)[1] == C.ACL_ERROR_INVALID_PARAM
    # more than any host has, up to a size_t's largest: refused, never an exception (2**63 raised
    # OverflowError: found by an API-sequence fuzzer of the CPU runtime)
    for size in (2**62, 2**63, 2**64 - 1):
        assert acl.rt.malloc_host(size) == (0, C.ACL_ERROR_BAD_ALLOC)


def test_memcpy_round_trip_and_kinds(acl, ctx, device_buffer):
    data = np.arange(64, dtype=np.uint8).tobytes()
    src = acl.util.bytes_to_ptr(data)
    dev_a, dev_b = device_buffer(64), device_buffer(64)
    host, _ = acl.rt.malloc_host(64)
    try:
        assert acl.rt.memcpy(dev_a, 64, src, 64, H2D) == 0
        assert acl.rt.memcpy(dev_b, 64, dev_a, 64, D2D) == 0
        assert acl.rt.memcpy(host, 64, dev_b, 64, D2H) == 0
        assert acl.util.ptr_to_bytes(host, 64) == data
        assert acl.rt.memcpy(host, 64, src, 64, H2H) == 0
        assert acl.rt.memset(dev_a, 64, 7, 64) == 0
        assert acl.rt.memcpy(host, 64, dev_a, 64, DEFAULT) == 0  # direction inferred
        assert acl.util.ptr_to_bytes(host, 64) == b"\x07" * 64
    finally:
        acl.rt.free_host(host)


def test_device_copies_take_malloc_host_memory_on_the_board_only(acl, ctx, device_buffer, acl_kind):
    """On the board (run mode ACL_DEVICE) aclrtMallocHost gives the device's own memory (CANN's
    aclrtMallocHost page; pyACL reference, section 4: host kinds act as D2D there), so a
    device-to-device copy between it and device memory is legal; on a host it is host memory,
    refused as a device side (107000). The CPU runtime refused it on the board too (found by a
    fidelity tester); test_acl_model.py's test_the_board_takes_malloc_host_memory_as_device_memory
    runs this there."""
    on_board = acl.rt.get_run_mode()[0] == C.ACL_DEVICE
    data = np.arange(64, dtype=np.uint8).tobytes()
    dev = device_buffer(64)
    host, _ = acl.rt.malloc_host(64)
    try:
        assert acl.rt.memcpy(dev, 64, acl.util.bytes_to_ptr(data), 64, H2D) == 0
        if on_board:
            assert acl.rt.memcpy(host, 64, dev, 64, D2D) == 0
            assert acl.util.ptr_to_bytes(host, 64) == data
            assert acl.rt.memset(dev, 64, 0, 64) == 0
            assert acl.rt.memcpy(dev, 64, host, 64, D2D) == 0
            assert acl.rt.memcpy(host, 64, dev, 64, D2H) == 0 and acl.util.ptr_to_bytes(host, 64) == data
        elif acl_kind == "cpu":  # undefined behaviour on a host's device; the CPU runtime checks it
            assert acl.rt.memcpy(host, 64, dev, 64, D2D) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memcpy(dev, 64, host, 64, D2D) == C.ACL_ERROR_RT_PARAM_INVALID
    finally:
        acl.rt.free_host(host)


def test_memcpy_error_codes(acl, ctx, device_buffer, acl_kind):
    data = bytes(256)
    src = acl.util.bytes_to_ptr(data)
    dev = device_buffer(64)  # 96 usable bytes: 64 rounded + 32 pad
    assert acl.rt.memcpy(dev, 64, src, 0, H2D) == 0
    assert acl.rt.memcpy(0, 64, src, 8, H2D) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(dev, 64, 0, 8, H2D) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(dev, 64, src, 8, 9) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(dev, 64, src, 65, H2D) == C.ACL_ERROR_RT_PARAM_INVALID
    if acl_kind != "cpu":
        return  # the rest is undefined behaviour on hardware; the CPU runtime checks it
    assert acl.rt.memcpy(dev + 64, 256, src, 256, H2D) == C.ACL_ERROR_RT_PARAM_INVALID  # leaves it
    assert acl.rt.memcpy(src, 64, dev, 8, H2D) == C.ACL_ERROR_RT_PARAM_INVALID  # dst is host
    assert acl.rt.memcpy(dev, 64, dev, 8, H2D) == C.ACL_ERROR_RT_PARAM_INVALID  # src is device
    assert acl.rt.memcpy(src, 64, src, 8, D2H) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memcpy(dev, 64, src, 8, D2D) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memcpy(dev, 64, src, 8, H2H) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memset(dev, 256, 0, 256) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memset(dev, 8, 0, 9) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memset(src, 8, 0, 8) == C.ACL_ERROR_RT_PARAM_INVALID


def test_memset_takes_malloc_host_memory(acl, ctx, acl_kind):
    """aclrtMemset and aclrtMemsetAsync set host memory as well as device memory, told apart by the
    address (CANN's pages for both; host memory not from an acl call such as aclrtMallocHost is
    undefined behaviour): the CPU runtime refused malloc_host memory with 107000 (found by a
    fidelity tester). Pageable memory stays refused."""
    host, ret = acl.rt.malloc_host(128)
    assert ret == 0
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.rt.memset(host, 128, 7, 64) == 0
        assert acl.rt.memset_async(host + 64, 64, 9, 64, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.util.ptr_to_bytes(host, 128) == b"\x07" * 64 + b"\x09" * 64
        if acl_kind == "cpu":  # undefined behaviour on hardware; the CPU runtime checks it
            assert acl.rt.memset(host, 256, 0, 129) == C.ACL_ERROR_RT_PARAM_INVALID  # past its 128 bytes
            pageable = bytes(64)
            assert acl.rt.memset(acl.util.bytes_to_ptr(pageable), 64, 0, 64) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memset_async(acl.util.bytes_to_ptr(pageable), 64, 0, 64, stream) \
                == C.ACL_ERROR_RT_PARAM_INVALID
    finally:
        assert acl.rt.destroy_stream(stream) == 0
        assert acl.rt.free_host(host) == 0


def test_a_zero_byte_copy_or_set_checks_its_pointers_and_kind_first(acl, ctx, device_buffer, acl_kind):
    """aclrtMemcpy and aclrtMemcpyAsync check dst and src not null, then the kind, before the
    count; aclrtMemset and aclrtMemsetAsync check devPtr first: each ACL_ERROR_INVALID_PARAM,
    100000; a zero count is a no-op only past those (hicann/runtime src/acl/aclrt_impl/memory.cpp
    and rtMemcpy(Async), in their earlier versions). The CPU runtime returned success for count
    0 before any check, as the file's latest version does (found by a fidelity tester, t70): it
    keeps the stricter order now, so a program that passes on it passes on either. A device
    gives 0 or 100000 for those, by its CANN."""
    dev, host = device_buffer(64), acl.util.bytes_to_ptr(bytes(64))
    stream, _ = acl.rt.create_stream()
    refused = (C.ACL_ERROR_INVALID_PARAM,) if acl_kind == "cpu" else (0, C.ACL_ERROR_INVALID_PARAM)
    try:
        for call in (lambda: acl.rt.memcpy(0, 64, host, 0, H2D),  # dst null
                     lambda: acl.rt.memcpy(dev, 64, 0, 0, H2D),  # src null
                     lambda: acl.rt.memcpy(dev, 64, host, 0, 99),  # no such kind
                     lambda: acl.rt.memcpy_async(0, 64, dev, 0, D2D, stream),
                     lambda: acl.rt.memcpy_async(dev, 64, 0, 0, D2D, stream),
                     lambda: acl.rt.memcpy_async(dev, 64, dev, 0, 99, stream),
                     lambda: acl.rt.memset(0, 64, 0, 0),  # devPtr null
                     lambda: acl.rt.memset_async(0, 64, 0, 0, stream)):
            assert call() in refused
        # past them, a zero count is a no-op: no other check is made (a host-to-host async copy, refused
        # with a non-zero count, a size over dst_max, host memory as a device side)
        assert acl.rt.memcpy(dev, 64, host, 0, H2D) == 0
        assert acl.rt.memcpy(host, 0, host, 0, D2H) == 0
        assert acl.rt.memcpy_async(host, 0, host, 0, H2H, stream) == 0
        assert acl.rt.memcpy_async(dev, 64, dev, 0, D2D, stream) == 0
        assert acl.rt.memset(dev, 0, 0, 0) == 0
        assert acl.rt.memset_async(dev, 0, 0, 0, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        assert acl.rt.destroy_stream(stream) == 0


def test_memcpy_async_runs_on_the_stream(acl, ctx, device_buffer, acl_kind):
    """Through CANN 8.x memcpy_async's host side is malloc_host memory and its addresses are
    64-byte aligned; otherwise the device copies wrongly without an error (pyACL reference,
    "memcpy_async"), which the CPU runtime refuses so that the mistake shows."""
    data = np.arange(64, dtype=np.uint8).tobytes()
    unpinned = acl.util.bytes_to_ptr(data)
    dev = device_buffer(128)
    # each used from its first 64-byte aligned byte: on the board (run mode ACL_DEVICE)
    # malloc_host's memory is not aligned so, as the slots do it
    src_block, _ = acl.rt.malloc_host(128 + 63)
    host_block, _ = acl.rt.malloc_host(64 + 63)
    src, host = (src_block + 63) & ~63, (host_block + 63) & ~63
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.rt.memcpy(src, 128, unpinned, 64, H2H) == 0  # staged into pinned memory
        assert acl.rt.memcpy_async(host, 64, src, 64, H2H, stream) == C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        assert acl.rt.memcpy_async(dev, 64, src, 65, H2D, stream) == C.ACL_ERROR_RT_PARAM_INVALID
        if acl_kind == "cpu":
            assert acl.rt.memcpy_async(src, 64, dev, 8, H2D, stream) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memcpy_async(dev, 64, unpinned, 64, H2D, stream) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memcpy_async(unpinned, 64, dev, 64, D2H, stream) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memcpy_async(dev + 32, 64, src, 64, H2D, stream) == C.ACL_ERROR_RT_PARAM_INVALID
            assert acl.rt.memcpy_async(dev, 64, src + 8, 64, H2D, stream) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.memcpy_async(dev, 128, src, 64, H2D, stream) == 0
        assert acl.rt.memcpy_async(host, 64, dev, 64, D2H, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.util.ptr_to_bytes(host, 64) == data
    finally:
        assert acl.rt.destroy_stream(stream) == 0
        acl.rt.free_host(host_block)
        acl.rt.free_host(src_block)
