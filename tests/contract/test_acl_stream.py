"""Streams (FIFO, timeouts, async errors), events and stream_wait_event, callbacks and reports.

Ordering is made deterministic with blocking callbacks gated by threading.Event: no timed
assertions (a timeout is only asserted where nothing can complete).
"""
from __future__ import annotations

import threading

import pytest

from aclserve.acl import constants as C

H2D, D2H = C.ACL_MEMCPY_HOST_TO_DEVICE, C.ACL_MEMCPY_DEVICE_TO_HOST


class ReportThread:
    """An acl.util.start_thread thread looping on process_report, subscribed to streams."""

    def __init__(self, acl, context):
        self.acl, self.stop, self.seen = acl, threading.Event(), []

        def loop(args):
            acl.rt.set_context(context)
            while not self.stop.is_set():
                self.seen.append(acl.rt.process_report(50))

        self.tid, ret = acl.util.start_thread(loop, [])
        assert ret == 0
        self.streams = []

    def subscribe(self, stream):
        assert self.acl.rt.subscribe_report(self.tid, stream) == 0
        self.streams.append(stream)

    def close(self):
        for s in self.streams:
            assert self.acl.rt.unsubscribe_report(self.tid, s) == 0
        self.stop.set()
        assert self.acl.util.stop_thread(self.tid) == 0


@pytest.fixture
def streams(acl, ctx):
    made = []

    def make():
        s, ret = acl.rt.create_stream()
        assert ret == 0
        made.append(s)
        return s

    yield make
    for s in made:
        assert acl.rt.destroy_stream(s) == 0


@pytest.fixture
def reports(acl, ctx):
    thread = ReportThread(acl, ctx)
    yield thread
    thread.close()


def _gate_callback(acl, stream, reports, gate, ran=None):
    """A blocking callback on `stream` that holds it until gate.set()."""
    def hold(user_data):
        if ran is not None:
            ran.set()
        gate.wait()
    assert acl.rt.launch_callback(hold, None, C.ACL_CALLBACK_BLOCK, stream) == 0


def test_stream_runs_tasks_in_fifo_order(acl, ctx, streams, device_buffer, host_buffer, pinned):
    s = streams()
    dev = device_buffer(4096)
    host = host_buffer(4096)
    for value in range(1, 20):  # each fill overwrites the previous one; the last must win
        data = bytes([value]) * 4096
        assert acl.rt.memcpy_async(dev, 4096, pinned(data), 4096, H2D, s) == 0
        if value % 7 == 0:
            assert acl.rt.synchronize_stream(s) == 0
    assert acl.rt.memcpy_async(host, 4096, dev, 4096, D2H, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    assert acl.util.ptr_to_bytes(host, 4096) == bytes([19]) * 4096


def test_default_stream_is_stream_zero(acl, ctx, device_buffer, host_buffer, pinned):
    dev = device_buffer(64)
    host = host_buffer(64)
    data = b"\x05" * 64
    assert acl.rt.memcpy_async(dev, 64, pinned(data), 64, H2D, 0) == 0
    assert acl.rt.memcpy_async(host, 64, dev, 64, D2H, 0) == 0
    assert acl.rt.synchronize_stream(0) == 0
    assert acl.util.ptr_to_bytes(host, 64) == data


def test_synchronize_stream_with_timeout_expires_with_507046(acl, ctx, streams, reports):
    s = streams()
    reports.subscribe(s)
    gate = threading.Event()
    _gate_callback(acl, s, reports, gate)
    assert acl.rt.synchronize_stream_with_timeout(s, 20) == C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    gate.set()
    assert acl.rt.synchronize_stream_with_timeout(s, -1) == 0


def test_many_waiters_on_one_event_and_one_stream(acl, ctx, streams, reports):
    """Threads blocked on one event and one stream at once are all released when the work
    completes; one whose timeout passes first gets its timeout code and leaves the others be."""
    s = streams()
    reports.subscribe(s)
    event, _ = acl.rt.create_event()
    gate = threading.Event()
    results: dict[str, int] = {}

    def wait(name, call):
        def run():
            acl.rt.set_context(ctx)
            results[name] = call()
        return threading.Thread(target=run)
    try:
        _gate_callback(acl, s, reports, gate)
        assert acl.rt.record_event(event, s) == 0
        waiters = [wait(f"event{i}", lambda: acl.rt.synchronize_event(event)) for i in range(4)]
        waiters += [wait(f"stream{i}", lambda: acl.rt.synchronize_stream(s)) for i in range(2)]
        waiters.append(wait("timed", lambda: acl.rt.synchronize_event_with_timeout(event, 30)))
        for t in waiters:
            t.start()
        waiters[-1].join(10)
        assert results == {"timed": C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT}
        gate.set()
        for t in waiters:
            t.join(10)
        assert results == {**{f"event{i}": 0 for i in range(4)}, "stream0": 0, "stream1": 0,
                           "timed": C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT}
        assert acl.rt.synchronize_event_with_timeout(event, 0) == 0
    finally:
        gate.set()
        assert acl.rt.destroy_event(event) == 0


def test_a_timeout_below_minus_one_is_a_runtime_param_error(acl, ctx, streams):
    """The *_with_timeout waits take -1 (forever) or >= 0 ms; below -1 the runtime answers
    ACL_ERROR_RT_PARAM_INVALID (107000), not 100000 (hicann/runtime src/acl/aclrt_impl/stream.cpp
    and event.cpp: timeout < -1 -> ACL_ERROR_RT_PARAM_INVALID, expect "[-1, INT_MAX]")."""
    s = streams()
    event, _ = acl.rt.create_event()
    try:
        assert acl.rt.record_event(event, s) == 0
        assert acl.rt.synchronize_stream_with_timeout(s, -2) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.synchronize_event_with_timeout(event, -2) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.synchronize_event_with_timeout(0, -2) == C.ACL_ERROR_RT_PARAM_INVALID  # checked first
        assert acl.rt.synchronize_stream_with_timeout(s, 0) in (0, C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)
        assert acl.rt.synchronize_event_with_timeout(event, -1) == 0
    finally:
        assert acl.rt.destroy_event(event) == 0


def test_events_record_query_synchronize_and_elapsed(acl, ctx, streams, reports):
    s = streams()
    reports.subscribe(s)
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    never, _ = acl.rt.create_event()
    try:
        assert acl.rt.synchronize_event(never) == 0  # never recorded: returns at once
        gate = threading.Event()
        assert acl.rt.record_event(start, s) == 0
        _gate_callback(acl, s, reports, gate)
        assert acl.rt.record_event(end, s) == 0
        assert acl.rt.synchronize_event(start) == 0
        assert acl.rt.query_event_status(start) == (C.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
        assert acl.rt.query_event_status(end) == (C.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
        assert acl.rt.synchronize_event_with_timeout(end, 20) == C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
        gate.set()
        assert acl.rt.synchronize_event(end) == 0
        assert acl.rt.query_event_status(end) == (C.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
        ms, ret = acl.rt.event_elapsed_time(start, end)
        assert ret == 0 and isinstance(ms, float) and ms >= 0.0
    finally:
        for e in (start, end, never):
            assert acl.rt.destroy_event(e) == 0


def test_elapsed_time_is_for_two_events_recorded_on_one_stream(acl, ctx, streams, cpu_only):
    """CANN's aclrtEventElapsedTime page times a start and an end event recorded "in the same
    Stream"; its runtime does not check (Event::ElapsedTime subtracts the two timestamps): the
    CPU runtime refuses a pair across streams (107000), whichever kinds of events they are."""
    a, b = streams(), streams()
    start, end = acl.rt.create_event()[0], acl.rt.create_event()[0]
    timed, ret = acl.rt.create_event_ex_with_flag(C.ACL_EVENT_SYNC | C.ACL_EVENT_TIME_LINE)
    assert ret == 0
    try:
        assert acl.rt.record_event(start, a) == 0 and acl.rt.record_event(end, b) == 0
        assert acl.rt.record_event(timed, b) == 0
        assert acl.rt.synchronize_stream(a) == 0 and acl.rt.synchronize_stream(b) == 0
        for first, second in ((start, end), (end, start), (start, timed)):
            assert acl.rt.event_elapsed_time(first, second) == (0.0, C.ACL_ERROR_RT_PARAM_INVALID)
        ms, ret = acl.rt.event_elapsed_time(end, timed)  # both on b
        assert ret == 0 and ms >= 0.0
        assert acl.rt.record_event(end, a) == 0 and acl.rt.synchronize_stream(a) == 0  # its latest record: on a
        ms, ret = acl.rt.event_elapsed_time(start, end)
        assert ret == 0 and ms >= 0.0
    finally:
        for e in (start, end, timed):
            assert acl.rt.destroy_event(e) == 0


def test_stream_wait_event_orders_work_across_streams(acl, ctx, streams, reports, device_buffer, host_buffer,
                                                      pinned):
    a, b = streams(), streams()
    reports.subscribe(a)
    dev = device_buffer(64)
    host = host_buffer(64)
    ready, done_b = acl.rt.create_event()[0], acl.rt.create_event()[0]
    try:
        gate = threading.Event()
        _gate_callback(acl, a, reports, gate)
        first = b"\x01" * 64
        assert acl.rt.memcpy_async(dev, 64, pinned(first), 64, H2D, a) == 0
        assert acl.rt.record_event(ready, a) == 0
        assert acl.rt.stream_wait_event(b, ready) == 0
        assert acl.rt.memcpy_async(host, 64, dev, 64, D2H, b) == 0
        assert acl.rt.record_event(done_b, b) == 0
        assert acl.rt.query_event_status(done_b) == (C.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
        gate.set()
        assert acl.rt.synchronize_stream(b) == 0
        assert acl.util.ptr_to_bytes(host, 64) == first  # b copied only after a wrote
    finally:
        assert acl.rt.synchronize_stream(a) == 0
        acl.rt.destroy_event(ready)
        acl.rt.destroy_event(done_b)


def test_an_event_of_create_event_ex_with_flag_is_waited_on_batch_after_batch(acl, ctx, streams, reports,
                                                                              device_buffer, host_buffer, pinned):
    """CANN: a SYNC event of create_event_ex_with_flag may be recorded again, each record
    replacing the last, and a stream waits for the latest: the slots' pattern (record on the
    copy stream, wait on the next, every batch). Both rounds keep their order, and TIME_LINE
    gives it timestamps."""
    a, b = streams(), streams()
    reports.subscribe(a)
    event, ret = acl.rt.create_event_ex_with_flag(C.ACL_EVENT_SYNC | C.ACL_EVENT_TIME_LINE)
    if ret != 0 and acl.get_soc_name() == "Ascend310":
        pytest.skip("the Atlas 200/300/500 has no create_event_ex_with_flag")
    assert ret == 0
    start, _ = acl.rt.create_event()
    dev = device_buffer(64)
    host = host_buffer(64)
    try:
        for value in (1, 2):
            gate = threading.Event()
            _gate_callback(acl, a, reports, gate)
            assert acl.rt.record_event(start, a) == 0
            assert acl.rt.memcpy_async(dev, 64, pinned(bytes([value]) * 64), 64, H2D, a) == 0
            assert acl.rt.record_event(event, a) == 0
            assert acl.rt.stream_wait_event(b, event) == 0
            assert acl.rt.memcpy_async(host, 64, dev, 64, D2H, b) == 0
            gate.set()
            assert acl.rt.synchronize_stream(b) == 0
            assert acl.util.ptr_to_bytes(host, 64) == bytes([value]) * 64  # b copied after a wrote
            ms, ret = acl.rt.event_elapsed_time(start, event)
            assert ret == 0 and ms >= 0
        assert acl.rt.reset_event(event, b) != 0  # CANN: not for these events
    finally:
        acl.rt.destroy_event(event)
        acl.rt.destroy_event(start)


def test_a_plain_event_a_stream_waited_on_is_reset_before_its_next_record(acl, ctx, streams, cpu_only):
    """CANN documents a plain event's cross-stream use as create, record, wait, reset; only the
    events of create_event_ex_with_flag are recorded again as they are. The device does not
    refuse a second record (it leaks the event's resources, or lets a wait pass early): the CPU
    runtime does (107000), so that the mistake shows."""
    a, b = streams(), streams()
    event, _ = acl.rt.create_event()
    try:
        assert acl.rt.record_event(event, a) == 0
        assert acl.rt.record_event(event, a) == 0  # never waited on: recorded again as it is
        assert acl.rt.stream_wait_event(b, event) == 0
        assert acl.rt.record_event(event, a) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.reset_event(event, b) == 0
        assert acl.rt.record_event(event, a) == 0
        assert acl.rt.synchronize_stream(b) == 0 and acl.rt.synchronize_stream(a) == 0
    finally:
        acl.rt.destroy_event(event)


def test_what_an_event_of_create_event_ex_with_flag_is_not_for(acl, ctx, streams, cpu_only):
    """Without ACL_EVENT_SYNC no stream waits on it, without TIME_LINE it has no time, and it is
    never reset nor queried with the old query_event (CANN: the device answers both with
    207000, RT_ERROR_FEATURE_NOT_SUPPORT for an event in "new mode"); unknown flags, and IPC
    with another, are refused."""
    a, b = streams(), streams()
    timed, _ = acl.rt.create_event_ex_with_flag(C.ACL_EVENT_TIME_LINE)
    synced, _ = acl.rt.create_event_ex_with_flag(C.ACL_EVENT_SYNC)
    try:
        assert acl.rt.create_event_ex_with_flag(0x4)[1] == C.ACL_ERROR_INVALID_PARAM
        assert acl.rt.create_event_ex_with_flag(C.ACL_EVENT_IPC | C.ACL_EVENT_SYNC)[1] == C.ACL_ERROR_INVALID_PARAM
        assert acl.rt.record_event(timed, a) == 0 and acl.rt.record_event(synced, a) == 0
        assert acl.rt.synchronize_stream(a) == 0
        assert acl.rt.stream_wait_event(b, timed) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.event_elapsed_time(timed, synced)[1] == C.ACL_ERROR_RT_PARAM_INVALID
        for event in (timed, synced):
            assert acl.rt.query_event(event)[1] == C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
            assert acl.rt.reset_event(event, b) == C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    finally:
        acl.rt.destroy_event(timed)
        acl.rt.destroy_event(synced)


def test_an_event_of_create_event_with_flag_is_used_as_its_flags_say(acl, ctx, streams, cpu_only):
    """CANN: without ACL_EVENT_SYNC no stream waits on it and it is not reset; without TIME_LINE
    it has no time; with SYNC it is recorded, waited on and reset, then recorded again."""
    a, b = streams(), streams()
    timed, ret = acl.rt.create_event_with_flag(C.ACL_EVENT_TIME_LINE)
    assert ret == 0
    synced, ret = acl.rt.create_event_with_flag(C.ACL_EVENT_SYNC)
    assert ret == 0
    try:
        assert acl.rt.record_event(timed, a) == 0 and acl.rt.record_event(synced, a) == 0
        assert acl.rt.stream_wait_event(b, timed) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.reset_event(timed, b) == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.stream_wait_event(b, synced) == 0
        assert acl.rt.record_event(synced, a) == C.ACL_ERROR_RT_PARAM_INVALID  # not reset yet
        assert acl.rt.reset_event(synced, b) == 0
        assert acl.rt.record_event(synced, a) == 0
        assert acl.rt.synchronize_stream(a) == 0 and acl.rt.synchronize_stream(b) == 0
        assert acl.rt.event_elapsed_time(timed, synced)[1] == C.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.create_event_with_flag(0x4)[1] == C.ACL_ERROR_INVALID_PARAM
    finally:
        acl.rt.destroy_event(timed)
        acl.rt.destroy_event(synced)


def test_callback_runs_in_the_subscribed_thread(acl, ctx, streams, reports):
    s = streams()
    reports.subscribe(s)
    calls = []
    for block in (C.ACL_CALLBACK_BLOCK, C.ACL_CALLBACK_NO_BLOCK):
        assert acl.rt.launch_callback(lambda data: calls.append((data, threading.get_ident())),
                                      ("user", block), block, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    done = threading.Event()
    assert acl.rt.launch_callback(lambda data: done.set(), None, 0, s) == 0
    done.wait()
    assert calls == [(("user", 1), reports.tid), (("user", 0), reports.tid)]


def test_block_type_decides_whether_the_stream_waits(acl, ctx, streams, reports):
    s = streams()
    reports.subscribe(s)
    after, _ = acl.rt.create_event()
    try:
        gate, ran = threading.Event(), threading.Event()
        def hold(_):
            ran.set()
            gate.wait()
        assert acl.rt.launch_callback(hold, None, C.ACL_CALLBACK_NO_BLOCK, s) == 0
        assert acl.rt.record_event(after, s) == 0
        assert acl.rt.synchronize_event(after) == 0  # not blocked by the running callback
        ran.wait()
        gate.set()
        gate2 = threading.Event()
        _gate_callback(acl, s, reports, gate2)
        assert acl.rt.record_event(after, s) == 0
        assert acl.rt.query_event_status(after) == (C.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
        gate2.set()
        assert acl.rt.synchronize_event(after) == 0
    finally:
        assert acl.rt.synchronize_stream(s) == 0
        acl.rt.destroy_event(after)


def test_report_codes(acl, ctx, streams):
    s = streams()
    assert acl.rt.process_report(0) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.process_report(-2) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.process_report(10) == C.ACL_ERROR_RT_THREAD_SUBSCRIBE  # this thread is not subscribed
    assert acl.rt.launch_callback(print, None, 2, s) == C.ACL_ERROR_INVALID_PARAM
    me = threading.get_ident()
    assert acl.rt.subscribe_report(me, s) == 0
    try:
        assert acl.rt.process_report(10) == C.ACL_ERROR_RT_REPORT_TIMEOUT  # nothing was launched
        box = []
        assert acl.rt.launch_callback(box.append, 42, C.ACL_CALLBACK_NO_BLOCK, s) == 0
        assert acl.rt.process_report(-1) == 0
        assert box == [42]
    finally:
        assert acl.rt.unsubscribe_report(me, s) == 0
    assert acl.rt.synchronize_stream(s) == 0


def test_start_and_stop_thread(acl):
    seen = []
    tid, ret = acl.util.start_thread(lambda args: seen.append((args, threading.get_ident())), ["a", 1])
    assert ret == 0
    assert acl.util.stop_thread(tid) == 0
    assert seen == [(["a", 1], tid)]
