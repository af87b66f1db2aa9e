"""The host side of a memcpy_async belongs to the copy until the copy has completed. On a device
an H2D source written before then is sent as it is when the DMA runs, and a D2H destination read
before then gives stale or partial bytes, both silently; the CPU runtime's streams run a copy as
soon as they can, so the server's tests could not see such a bug. Here a D2H destination reads
as 0xFF (NaN, -1) until its copy ran, and a copy whose host side was written before it ran fails
(107000), both with ACLSERVE_CPU_CHECK_HOST, which the suite sets (aclserve/acl/cpu/_async_host.py).
CPU-only: a device gives wrong data, not these.

Each copy waits on a stream held back by an event wait (a blocking callback on the other stream,
gated by a threading.Event), so the host's write comes before the copy runs: no timing.
"""
from __future__ import annotations

import gc
import logging
import threading
import weakref

import numpy as np
import pytest

from aclserve.acl import constants as C
from aclserve.acl.cpu import _state, _stream, faults

from .test_acl_stream import ReportThread, _gate_callback

H2D, D2H = C.ACL_MEMCPY_HOST_TO_DEVICE, C.ACL_MEMCPY_DEVICE_TO_HOST
SIZE = 64


class Held:
    """Stream `waiting`, held back by its wait for an event of stream `holder`, which a blocking
    callback holds until release()."""

    def __init__(self, acl, context):
        self.acl = acl
        self.holder, _ = acl.rt.create_stream()
        self.waiting, _ = acl.rt.create_stream()
        self.ready, _ = acl.rt.create_event()
        self.reports = ReportThread(acl, context)
        self.reports.subscribe(self.holder)
        self.gate = threading.Event()
        _gate_callback(acl, self.holder, self.reports, self.gate)
        assert acl.rt.record_event(self.ready, self.holder) == 0
        assert acl.rt.stream_wait_event(self.waiting, self.ready) == 0

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        assert self.acl.rt.synchronize_stream(self.holder) == 0
        self.acl.rt.synchronize_stream(self.waiting)
        self.reports.close()
        for stream in (self.holder, self.waiting):
            assert self.acl.rt.destroy_stream(stream) == 0
        assert self.acl.rt.destroy_event(self.ready) == 0


@pytest.fixture
def held(acl, ctx, cpu_only):
    stream = Held(acl, ctx)
    yield stream
    stream.close()


def fill(acl, ptr: int, data: bytes) -> None:
    assert acl.rt.memcpy(ptr, len(data), acl.util.bytes_to_ptr(data), len(data), C.ACL_MEMCPY_HOST_TO_HOST) == 0


def device_with(acl, device_buffer, data: bytes) -> int:
    dev = device_buffer(len(data))
    assert acl.rt.memcpy(dev, len(data), acl.util.bytes_to_ptr(data), len(data), H2D) == 0
    return dev


def test_a_d2h_destination_is_poison_from_the_call_until_its_copy_ran(acl, ctx, device_buffer, host_buffer, held,
                                                                      host_checks, clean_faults):
    """Before, the host read the last batch's answer there: plausible, and wrong. The poison comes
    as the stream takes the copy: a call a stopped context refuses leaves the destination alone."""
    answer = np.arange(SIZE // 4, dtype=np.float32).tobytes()
    dev = device_with(acl, device_buffer, answer)
    host = host_buffer(SIZE)
    fill(acl, host, b"\x01" * SIZE)  # what an earlier copy left there
    assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, held.waiting) == 0
    early = acl.util.ptr_to_bytes(host, SIZE)
    assert early == b"\xff" * SIZE
    assert np.isnan(np.frombuffer(early, np.float32)).all() and (np.frombuffer(early, np.int64) == -1).all()
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == answer

    other, _ = acl.rt.create_context(0)
    try:
        stopped, _ = acl.rt.create_stream()
        assert acl.rt.set_stream_failure_mode(stopped, C.ACL_STOP_ON_FAILURE) == 0
        faults.inject("memcpy", nth=1)
        assert acl.rt.memcpy_async(dev, SIZE, host, SIZE, H2D, stopped) == 0
        assert acl.rt.synchronize_stream(stopped) == C.ACL_ERROR_RT_MODEL_EXECUTE  # the context stopped
        assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, stopped) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.util.ptr_to_bytes(host, SIZE) == answer
        assert acl.rt.destroy_stream(stopped) == 0
    finally:
        assert acl.rt.set_context(ctx) == 0
        assert acl.rt.destroy_context(other) == 0


def test_an_h2d_source_written_before_its_copy_ran_fails_the_copy(acl, ctx, device_buffer, pinned, held, host_checks,
                                                                 caplog):
    before = b"\x03" * SIZE
    dev = device_with(acl, device_buffer, before)
    src = pinned(b"\x04" * SIZE)
    assert acl.rt.memcpy_async(dev, SIZE, src, SIZE, H2D, held.waiting) == 0
    fill(acl, src, b"\x05" * SIZE)  # the next batch packed into the buffer its copy still owns
    held.release()
    with caplog.at_level(logging.ERROR, logger="aclserve.acl.cpu"):
        assert acl.rt.synchronize_stream(held.waiting) == C.ACL_ERROR_RT_PARAM_INVALID
    assert "host source of an async copy written before the copy ran" in acl.get_recent_err_msg()
    assert f"memcpy_async of {SIZE} bytes from {src:#x} to {dev:#x}: host source of an async copy written " \
           "before the copy ran" in caplog.text
    assert acl.util.ptr_to_bytes(dev, SIZE) == before  # not copied
    assert acl.rt.memcpy_async(dev, SIZE, src, SIZE, H2D, held.waiting) == 0  # the stream goes on
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(dev, SIZE) == b"\x05" * SIZE


def test_a_d2h_destination_written_before_its_copy_ran_fails_the_copy(acl, ctx, device_buffer, host_buffer, held,
                                                                     host_checks):
    dev = device_with(acl, device_buffer, b"\x06" * SIZE)
    host = host_buffer(SIZE)
    assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, held.waiting) == 0
    fill(acl, host + SIZE - 1, b"\x00")  # its last byte only
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == C.ACL_ERROR_RT_PARAM_INVALID
    assert "host destination of an async copy written before the copy ran" in acl.get_recent_err_msg()


def test_host_sides_left_alone_until_their_copies_completed_pass(acl, ctx, device_buffer, pinned, host_buffer,
                                                                 held, host_checks):
    """No false alarm: two copies from one unchanged source, a round trip through separate host
    buffers, each written again only after a synchronize."""  # (the second copy from src: unchecked)
    dev = device_buffer(2 * SIZE)
    src, back = pinned(b"\x07" * SIZE), host_buffer(2 * SIZE)
    for second in (b"\x08" * SIZE, b"\x09" * SIZE):
        assert acl.rt.memcpy_async(dev, SIZE, src, SIZE, H2D, held.waiting) == 0
        assert acl.rt.memcpy_async(dev + SIZE, SIZE, src, SIZE, H2D, held.waiting) == 0
        assert acl.rt.memcpy_async(back, 2 * SIZE, dev, 2 * SIZE, D2H, held.waiting) == 0
        held.release()
        assert acl.rt.synchronize_stream(held.waiting) == 0
        assert acl.util.ptr_to_bytes(back, 2 * SIZE) == acl.util.ptr_to_bytes(src, SIZE) * 2
        fill(acl, src, second)


def test_without_the_check_a_source_written_early_is_copied_as_it_then_is(acl, ctx, device_buffer, pinned, held,
                                                                         monkeypatch):
    """As a device does (ACLSERVE_CPU_CHECK_HOST=0): the copy sends the bytes there when it runs."""
    monkeypatch.setattr(_state, "check_host", False)
    dev = device_buffer(SIZE)
    src = pinned(b"\x0a" * SIZE)
    assert acl.rt.memcpy_async(dev, SIZE, src, SIZE, H2D, held.waiting) == 0
    fill(acl, src, b"\x0b" * SIZE)
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(dev, SIZE) == b"\x0b" * SIZE


def test_without_the_check_a_d2h_destination_keeps_its_bytes_until_its_copy_ran(acl, ctx, device_buffer,
                                                                                host_buffer, held, monkeypatch):
    """ACLSERVE_CPU_CHECK_HOST=0 (the default): no poison, as a device (and as before the checker
    mode): the destination holds what was there until the copy ran."""
    monkeypatch.setattr(_state, "check_host", False)
    dev = device_with(acl, device_buffer, b"\x0c" * SIZE)
    host = host_buffer(SIZE)
    fill(acl, host, b"\x0d" * SIZE)
    assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == b"\x0d" * SIZE
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == b"\x0c" * SIZE


@pytest.mark.parametrize("check", [True, False], ids=["check-on", "check-off"])
def test_a_host_buffer_reused_by_copies_one_stream_orders_gives_the_right_bytes(acl, ctx, device_buffer, pinned,
                                                                                host_buffer, held, monkeypatch,
                                                                                check):
    """Well defined on a device: the stream runs them in order. Before, the round trip's D2H
    poisoned A at its call, before the H2D read A (A came back 0xFF; with the check, 107000), and
    the bounce's H2D took a snapshot of B's poison (107000). Both calls come before either runs."""
    monkeypatch.setattr(_state, "check_host", check)
    data = bytes(range(SIZE))
    a, dev = pinned(data), device_buffer(SIZE)
    assert acl.rt.memcpy_async(dev, SIZE, a, SIZE, H2D, held.waiting) == 0  # round trip: A to the device
    assert acl.rt.memcpy_async(a, SIZE, dev, SIZE, D2H, held.waiting) == 0  # and back into A
    b, there = host_buffer(SIZE), device_buffer(SIZE)
    assert acl.rt.memcpy_async(b, SIZE, dev, SIZE, D2H, held.waiting) == 0  # bounce: into B
    assert acl.rt.memcpy_async(there, SIZE, b, SIZE, H2D, held.waiting) == 0  # and from B on
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(a, SIZE) == data
    assert acl.util.ptr_to_bytes(there, SIZE) == data


def test_two_d2h_copies_into_one_destination(acl, ctx, device_buffer, host_buffer, held, host_checks):
    """On one stream the second's bytes, no false alarm (before: the second's poison failed the
    first's check, 107000); the destination is poisoned and checked again once both ran. On
    streams nothing orders, the later copy running first still fails the earlier's check."""
    first, second = device_with(acl, device_buffer, b"\x0e" * SIZE), device_with(acl, device_buffer, b"\x0f" * SIZE)
    host = host_buffer(SIZE)
    assert acl.rt.memcpy_async(host, SIZE, first, SIZE, D2H, held.waiting) == 0
    assert acl.rt.memcpy_async(host, SIZE, second, SIZE, D2H, held.waiting) == 0
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == b"\x0f" * SIZE

    racing, _ = acl.rt.create_stream()
    try:
        gate = Held(acl, ctx)
        try:
            assert acl.rt.memcpy_async(host, SIZE, first, SIZE, D2H, gate.waiting) == 0
            assert acl.util.ptr_to_bytes(host, SIZE) == b"\xff" * SIZE  # no copy of it pending: poisoned
            assert acl.rt.memcpy_async(host, SIZE, second, SIZE, D2H, racing) == 0  # overlaps: not poisoned
            assert acl.rt.synchronize_stream(racing) == 0
            gate.release()
            assert acl.rt.synchronize_stream(gate.waiting) == C.ACL_ERROR_RT_PARAM_INVALID
            assert "host destination of an async copy written before the copy ran" in acl.get_recent_err_msg()
        finally:
            gate.close()
    finally:
        assert acl.rt.destroy_stream(racing) == 0


def test_a_memset_of_host_memory_owns_it_until_it_ran(acl, ctx, host_buffer, held, host_checks):
    """A memset_async of malloc_host memory writes it when its stream gets there, as a D2H copy does
    its destination: it was in no check, so a read before it ran saw the old bytes and a write was
    silently overwritten. Now the memory reads 0xFF from the call, and one written before it ran
    fails it (107000)."""
    host = host_buffer(SIZE)
    fill(acl, host, b"\x01" * SIZE)
    assert acl.rt.memset_async(host, SIZE, 7, SIZE, held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == b"\xff" * SIZE
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(host, SIZE) == b"\x07" * SIZE

    gate = Held(acl, ctx)
    try:
        assert acl.rt.memset_async(host, SIZE, 8, SIZE, gate.waiting) == 0
        fill(acl, host, b"\x02")  # its first byte only
        gate.release()
        assert acl.rt.synchronize_stream(gate.waiting) == C.ACL_ERROR_RT_PARAM_INVALID
        assert "host memory of an async memset written before the memset ran" in acl.get_recent_err_msg()
    finally:
        gate.close()


def test_a_memset_then_a_copy_of_that_host_memory_on_one_stream_gives_the_right_bytes(
        acl, ctx, device_buffer, host_buffer, held, host_checks):
    """Zeroing a host buffer and sending it, the stream ordering both: well defined on a device. The
    copy, seeing no memset pending there, took a snapshot of the bytes before the memset and failed
    its run (107000, a false alarm)."""
    host, dev = host_buffer(SIZE), device_with(acl, device_buffer, b"\x03" * SIZE)
    fill(acl, host, b"\x01" * SIZE)
    assert acl.rt.memset_async(host, SIZE, 0, SIZE, held.waiting) == 0
    assert acl.rt.memcpy_async(dev, SIZE, host, SIZE, H2D, held.waiting) == 0
    held.release()
    assert acl.rt.synchronize_stream(held.waiting) == 0
    assert acl.util.ptr_to_bytes(dev, SIZE) == bytes(SIZE)


def test_a_destroyed_stream_is_not_kept_by_its_copies_host_sides(acl, ctx, cpu_only, device_buffer, host_buffer,
                                                                host_checks):
    """The pending host spans held each copy's stream until another copy's call pruned them: a
    destroyed stream (and its context) stayed alive as long as no async copy came after."""
    dev, host = device_with(acl, device_buffer, b"\x04" * SIZE), host_buffer(SIZE)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    kept = weakref.ref(_state.streams[stream])
    assert acl.rt.destroy_stream(stream) == 0
    gc.collect()
    assert kept() is None


def test_the_copies_an_abort_drops_own_their_host_side_no_more(acl, ctx, device_buffer, host_buffer, held,
                                                              host_checks, monkeypatch):
    """A stream whose running task does not end (a blocking callback) is aborted: the D2H copy behind
    it is dropped, its destination the host's again. Its span stayed pending while that task ran (for
    good, for one that never ends): a later copy into the buffer was neither poisoned nor checked."""
    monkeypatch.setattr(_stream, "ABORT_WAIT_S", 0.05)  # (the abort gives up on the callback)
    dev, host = device_with(acl, device_buffer, b"\x05" * SIZE), host_buffer(SIZE)
    stuck, _ = acl.rt.create_stream()
    reports, gate, running = ReportThread(acl, ctx), threading.Event(), threading.Event()
    reports.subscribe(stuck)
    try:
        _gate_callback(acl, stuck, reports, gate, running)
        assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, stuck) == 0
        assert running.wait(60)  # (a hang guard; an abort before it began dropped it too)
        assert acl.rt.stream_abort(stuck) == C.ACL_ERROR_RT_INTERNAL_ERROR  # the callback runs on
        fill(acl, host, b"\x01" * SIZE)  # the dropped copy never runs: the host uses its buffer
        assert acl.rt.memcpy_async(host, SIZE, dev, SIZE, D2H, held.waiting) == 0
        assert acl.util.ptr_to_bytes(host, SIZE) == b"\xff" * SIZE  # checked as any copy
        held.release()
        assert acl.rt.synchronize_stream(held.waiting) == 0
        assert acl.util.ptr_to_bytes(host, SIZE) == b"\x05" * SIZE
    finally:
        gate.set()
        assert acl.rt.synchronize_stream(stuck) == C.ACL_ERROR_RT_STREAM_ABORT
        reports.close()
        assert acl.rt.destroy_stream(stuck) == 0
