"""Contexts are per thread; devices and streams belong together."""
from __future__ import annotations

import inspect
import threading

import pytest

from aclserve.acl import constants as C

from .thread_frames import wait_until_at


def _in_thread(fn):
    result = {}

    def body():
        try:
            result["value"] = fn()
        except BaseException as e:  # surfaced in the test thread
            result["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_thread_without_context_gets_107002(acl, ctx, device_buffer):
    dev = device_buffer(64)
    stream, ret = acl.rt.create_stream()
    assert ret == 0

    def calls():
        host = b"x" * 64
        return {
            "get_context": acl.rt.get_context()[1],
            "malloc": acl.rt.malloc(64, 0)[1],
            "malloc_host": acl.rt.malloc_host(64)[1],
            "create_stream": acl.rt.create_stream()[1],
            "create_event": acl.rt.create_event()[1],
            "synchronize_stream": acl.rt.synchronize_stream(stream),
            "memcpy": acl.rt.memcpy(dev, 64, acl.util.bytes_to_ptr(host), 64, C.ACL_MEMCPY_HOST_TO_DEVICE),
            "load": acl.mdl.load_from_file("/nonexistent.om")[1],
            "execute": acl.mdl.execute(1, 1, 1),
            "get_mem_info": acl.rt.get_mem_info(0)[2],
        }

    codes = _in_thread(calls)
    assert codes == dict.fromkeys(codes, C.ACL_ERROR_RT_CONTEXT_NULL)

    def with_context():
        assert acl.rt.set_context(ctx) == 0
        return acl.rt.get_context(), acl.rt.synchronize_stream(stream)

    assert _in_thread(with_context) == ((ctx, 0), 0)
    assert acl.rt.destroy_stream(stream) == 0


def test_event_waits_queries_timings_destroys_and_frees_need_no_context(acl, ctx):
    """CANN's EventSynchronize, EventQueryStatus, EventElapsedTime and EventDestroy look at the
    event alone, and DevFree and HostFree fall back to the driver in a thread without a context
    (hicann/runtime ApiImpl::HostFree): these succeed there (record and stream waits do need the
    context). free_host needed one on the CPU runtime (107002; found by a fidelity tester)."""
    stream, _ = acl.rt.create_stream()
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    ptr, ret = acl.rt.malloc(64, 0)
    assert ret == 0
    host, ret = acl.rt.malloc_host(64)
    assert ret == 0
    assert acl.rt.record_event(start, stream) == 0
    assert acl.rt.record_event(end, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0

    def no_context():
        return {
            "synchronize_event": acl.rt.synchronize_event(end),
            "query_event_status": acl.rt.query_event_status(end),
            "event_elapsed_time": acl.rt.event_elapsed_time(start, end)[1],
            "destroy_event": acl.rt.destroy_event(start),
            "free": acl.rt.free(ptr),
            "free_host": acl.rt.free_host(host),
            "record_event": acl.rt.record_event(end, stream),
        }

    ok = C.ACL_SUCCESS
    assert _in_thread(no_context) == {
        "synchronize_event": ok, "query_event_status": (C.ACL_EVENT_RECORDED_STATUS_COMPLETE, ok),
        "event_elapsed_time": ok, "destroy_event": ok, "free": ok, "free_host": ok,
        "record_event": C.ACL_ERROR_RT_CONTEXT_NULL}
    assert acl.rt.destroy_event(end) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_set_device_binds_default_context_in_the_calling_thread(acl, ctx):
    def body():
        assert acl.rt.set_device(0) == 0
        default_ctx, ret = acl.rt.get_context()
        ptr, ret2 = acl.rt.malloc(64, 0)
        freed = acl.rt.free(ptr)
        assert acl.rt.reset_device(0) == 0
        return default_ctx, ret, ret2, freed

    default_ctx, ret, ret2, freed = _in_thread(body)
    assert (ret, ret2, freed) == (0, 0, 0)
    assert default_ctx not in (0, ctx)
    assert acl.rt.get_context() == (ctx, 0)  # other threads keep their own context


def test_create_context_makes_it_current_and_handle_rules(acl, ctx):
    other, ret = acl.rt.create_context(0)
    assert ret == 0 and acl.rt.get_context() == (other, 0)
    assert acl.rt.set_context(ctx) == 0 and acl.rt.get_context() == (ctx, 0)
    assert acl.rt.destroy_context(other) == 0
    assert acl.rt.set_context(0) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.destroy_context(0) == C.ACL_ERROR_INVALID_PARAM
    assert acl.rt.get_context() == (ctx, 0)


def test_garbage_handles_are_rejected(acl, ctx, acl_kind):
    if acl_kind != "cpu":
        pytest.skip("garbage handles are undefined behaviour on hardware")
    garbage = 0x1234_5678
    assert acl.rt.set_context(garbage) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.destroy_context(garbage) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.destroy_stream(garbage) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.synchronize_stream(garbage) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.record_event(garbage, 0) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.destroy_event(garbage) == C.ACL_ERROR_RT_PARAM_INVALID
    assert acl.mdl.get_num_inputs(garbage) == 0
    assert acl.mdl.destroy_dataset(garbage) == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.get_desc(garbage, 1) == C.ACL_ERROR_INVALID_PARAM
    assert acl.get_data_buffer_addr(garbage) == 0
    assert acl.mdl.unload(garbage) == C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    assert acl.mdl.load_from_mem(0x10, 4096) == (0, C.ACL_ERROR_INVALID_PARAM)  # unmapped: no crash


def test_invalid_device_id(acl, ctx):
    count, _ = acl.rt.get_device_count()
    assert acl.rt.set_device(count + 99) == C.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.create_context(count + 99) == (0, C.ACL_ERROR_RT_INVALID_DEVICEID)
    assert acl.rt.get_context() == (ctx, 0)


def test_stream_of_another_device_is_synchronized_but_takes_no_work(acl, ctx):
    count, _ = acl.rt.get_device_count()
    if count < 2:
        pytest.skip("needs two devices")
    stream0, ret = acl.rt.create_stream()
    assert ret == 0
    ctx1, ret = acl.rt.create_context(1)
    assert ret == 0
    try:
        assert acl.rt.synchronize_stream(stream0) == 0  # switched to its context and back (CANN)
        assert acl.rt.get_context() == (ctx1, 0)
        event, _ = acl.rt.create_event()
        assert acl.rt.record_event(event, stream0) == C.ACL_ERROR_RT_STREAM_CONTEXT
        assert acl.rt.destroy_event(event) == 0
    finally:
        assert acl.rt.destroy_context(ctx1) == 0
        assert acl.rt.set_context(ctx) == 0
    assert acl.rt.destroy_stream(stream0) == 0


@pytest.mark.parametrize("make", ["create_stream", "create_event"])
def test_a_stream_or_event_made_while_another_thread_destroys_the_context_is_refused(acl, ctx, cpu_only, make):
    """A create_stream / create_event that found its context current and registers after another
    thread destroyed that context is refused as if the destroy had come first (it registered a
    stream or event of a destroyed context, which nothing could destroy: found by an API-sequence
    fuzzer of the CPU runtime, 1 race in 300). The interleaving is made with the runtime's own
    lock, held here: a second thread's call passes current() and waits for it where it registers
    (seen in that thread's frame); the context is destroyed then (the lock is re-entrant), and the
    lock let go."""
    from aclserve.acl.cpu import _rt_events, _state, rt
    registers = {"create_stream": inspect.unwrap(rt.create_stream), "create_event": _rt_events._create}[make]
    other, ret = acl.rt.create_context(0)
    assert ret == 0 and acl.rt.set_context(ctx) == 0
    destroyed = _state.contexts[other]
    made = []

    def call():
        assert acl.rt.set_context(other) == 0
        made.append(getattr(acl.rt, make)())

    caller = threading.Thread(target=call)
    with _state.lock:
        caller.start()
        wait_until_at(caller, registers, "with _state.lock:")
        assert acl.rt.destroy_context(other) == 0
    caller.join(30)
    assert made == [(0, C.ACL_ERROR_RT_CONTEXT_NULL)]
    assert not [o for o in (*_state.streams.values(), *_state.events.values()) if o.context is destroyed]
