"""A failed task and the stream failure modes: continue (the default: only the stream's
synchronize reports it), stop (ACL_STOP_ON_FAILURE: the whole context stops, its waits and
queries report it), and stream_abort. What hicann/runtime's api_impl.cc does, on the CPU runtime."""
from __future__ import annotations

import threading

from aclserve.acl import constants as C
from aclserve.acl.cpu import _stream, faults

from .conftest import MBATCH
from .thread_frames import wait_until_at


def test_an_async_failure_shows_at_the_streams_synchronize_not_at_an_events(acl, loaded_mlp):
    """In CANN's default mode (ACL_CONTINUE_ON_FAILURE) the stream runs on after a failed task
    and an event recorded after it completes: its synchronize returns 0 (hicann/runtime: an
    event's synchronize checks only the context's stop-on-failure state, Context::CheckStatus;
    the stream's error is read, and cleared, by the stream's synchronize, GetSynchronizeError)."""
    m = loaded_mlp
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    try:  # set to a gear, then the mbatch buffer overwritten with 0: detected when the stream runs the model
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
        assert acl.rt.memset(m.buffer_ptr(m.inputs, MBATCH), 8, 0, 8) == 0
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert acl.rt.record_event(event, stream) == 0
        assert acl.rt.synchronize_event(event) == 0  # the failure is not the event's
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.rt.synchronize_stream(stream) == 0  # cleared once reported
    finally:
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(stream) == 0


def test_a_context_set_to_stop_on_failure_stops_its_streams_and_reports_it_everywhere(acl, loaded_mlp, host_buffer):
    """ACL_STOP_ON_FAILURE on one stream stops every stream of its context on a failed task
    (CANN's aclrtSetStreamFailureMode page): an event's synchronize then returns the failure,
    the work queued behind it does not run, and no new task is taken."""
    m = loaded_mlp
    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    host = host_buffer(64)
    try:
        assert acl.rt.set_stream_failure_mode(a, C.ACL_STOP_ON_FAILURE) == 0
        # the same mode again is taken, stop back to continue is not (ApiImpl::StreamSetMode)
        assert acl.rt.set_stream_failure_mode(a, C.ACL_STOP_ON_FAILURE) == 0
        assert acl.rt.set_stream_failure_mode(a, C.ACL_CONTINUE_ON_FAILURE) == C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        assert acl.rt.set_stream_failure_mode(b, C.ACL_CONTINUE_ON_FAILURE) == 0  # its mode already
        assert acl.rt.set_stream_failure_mode(0, C.ACL_STOP_ON_FAILURE) == C.ACL_ERROR_INVALID_PARAM
        assert acl.rt.set_stream_failure_mode(b, 2) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
        assert acl.rt.memset(m.buffer_ptr(m.inputs, MBATCH), 8, 0, 8) == 0  # not the gear set: fails when run
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, a) == 0
        assert acl.rt.record_event(event, a) == 0
        assert acl.rt.synchronize_event(event) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        # an event's query checks the context first (ApiImpl::EventQueryStatus), as a synchronous
        # execute's submission does (CANN runs it on a stream of the context's own)
        assert acl.rt.query_event_status(event) == (0, C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        # the other stream of the context is stopped too: no new task, its waits report it
        assert acl.rt.memcpy_async(host, 64, m.buffer_ptr(m.outputs, 0), 64, C.ACL_MEMCPY_DEVICE_TO_HOST, b) \
            == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.rt.synchronize_stream(b) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.rt.synchronize_stream(a) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID  # kept, not cleared
    finally:
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(a) == 0
        assert acl.rt.destroy_stream(b) == 0


def test_a_synchronous_execute_that_fails_stops_a_context_in_stop_mode(acl, loaded_mlp):
    """aclmdlExecute runs on a stream of the context's own: in stop-on-failure mode its failure
    stops the context like a failed task of the context's streams."""
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
    a, _ = acl.rt.create_stream()
    try:
        assert acl.rt.set_stream_failure_mode(a, C.ACL_STOP_ON_FAILURE) == 0
        faults.inject("execute", nth=1)
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.rt.synchronize_stream(a) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, a) == C.ACL_ERROR_RT_MODEL_EXECUTE
    finally:
        faults.clear()
        assert acl.rt.destroy_stream(a) == 0


def test_a_stop_ends_the_waits_under_way(acl, loaded_mlp, host_buffer):
    """A wait under way when its context stops on a failure (another stream's task) ends with
    the failure, while the task it waits behind still runs: CANN's waits check the context."""
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    host = host_buffer(64)
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)
    waits = {}
    try:
        assert acl.rt.set_stream_failure_mode(a, C.ACL_STOP_ON_FAILURE) == 0
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, a) == 0
        assert acl.rt.record_event(event, a) == 0
        assert held.entered.wait(10)
        context, _ = acl.rt.get_context()
        waiters = [threading.Thread(target=lambda: waits.update(event=acl.rt.synchronize_event(event))),
                   threading.Thread(target=lambda: (acl.rt.set_context(context),
                                                    waits.update(stream=acl.rt.synchronize_stream(a))))]
        for thread in waiters:
            thread.start()
        for thread in waiters:  # both waiting behind the held execution
            wait_until_at(thread, _stream.block)
        faults.inject("memcpy", nth=1)
        assert acl.rt.memcpy_async(host, 64, m.buffer_ptr(m.outputs, 0), 64, C.ACL_MEMCPY_DEVICE_TO_HOST, b) == 0
        for thread in waiters:
            thread.join(10)
        assert waits == {"event": C.ACL_ERROR_RT_MODEL_EXECUTE, "stream": C.ACL_ERROR_RT_MODEL_EXECUTE}
        assert not gate.is_set()  # the execution still runs
        # a stream of another context waiting for the stopped stream's event stays stalled (on
        # the device it waits for good: CANN's aclrtStreamAbort page), not woken by the stop
        other, _ = acl.rt.create_context(0)
        try:
            c, _ = acl.rt.create_stream()
            after, _ = acl.rt.create_event()
            assert acl.rt.stream_wait_event(c, event) == 0
            assert acl.rt.record_event(after, c) == 0
            assert acl.rt.synchronize_event_with_timeout(after, 200) == C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
            gate.set()  # the held execution ends: the event's record runs, the wait is over
            assert acl.rt.synchronize_event_with_timeout(after, 10_000) == 0
            assert acl.rt.destroy_event(after) == 0
            assert acl.rt.destroy_stream(c) == 0
        finally:
            assert acl.rt.set_context(context) == 0
            assert acl.rt.destroy_context(other) == 0
    finally:
        gate.set()
        faults.clear()
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(a) == 0
        assert acl.rt.destroy_stream(b) == 0


def test_stream_abort_drops_the_queued_work_after_the_task_running(acl, loaded_mlp):
    """aclrtStreamAbort: what a stream holds queued is not run, the task running ends first (a
    CPU thread cannot be stopped midway), the next synchronize reports 107023 once; a stream
    of a stopped context synchronizes at once, while its task still runs."""
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
    stream, _ = acl.rt.create_stream()
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)
    try:
        for _ in range(3):
            assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert held.entered.wait(10)
        threading.Timer(0.2, gate.set).start()
        assert acl.rt.stream_abort(stream) == 0  # returns once the held execution has ended
        assert gate.is_set()
        assert held.seen == 1  # the two queued executions did not run
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_RT_STREAM_ABORT
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0  # usable again
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.stream_abort(0) == C.ACL_ERROR_INVALID_PARAM
    finally:
        gate.set()
        faults.clear()
        assert acl.rt.destroy_stream(stream) == 0


def _stop(acl, stream, host, device) -> None:
    """Stop `stream`'s context (stop mode) with a failed copy."""
    assert acl.rt.set_stream_failure_mode(stream, C.ACL_STOP_ON_FAILURE) == 0
    faults.inject("memcpy", nth=1)
    assert acl.rt.memcpy_async(host, 64, device, 64, C.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
    assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_RT_MODEL_EXECUTE


def test_a_record_or_wait_a_stopped_context_refuses_leaves_the_event_as_it_was(acl, ctx, host_buffer,
                                                                            device_buffer):
    """A stopped context refuses a record and a stream's wait: the event is not left waiting for
    a record that never runs (another context's stream waiting on it stalled, and destroying that
    stream blocked), nor marked waited (a plain event's next record was refused with 107000).
    Found by an API-sequence fuzzer of the CPU runtime."""
    recorded, _ = acl.rt.create_event()  # events of the healthy context
    waited, _ = acl.rt.create_event()
    healthy, _ = acl.rt.create_stream()
    other, _ = acl.rt.create_context(0)
    try:
        stopped, _ = acl.rt.create_stream()
        _stop(acl, stopped, host_buffer(64), device_buffer(64))
        assert acl.rt.record_event(recorded, stopped) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.rt.stream_wait_event(stopped, waited) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.rt.destroy_stream(stopped) == 0
    finally:
        faults.clear()
        assert acl.rt.set_context(ctx) == 0
        assert acl.rt.destroy_context(other) == 0
    assert acl.rt.query_event_status(recorded) == (C.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)  # never recorded
    assert acl.rt.stream_wait_event(healthy, recorded) == 0
    assert acl.rt.synchronize_stream_with_timeout(healthy, 2000) == 0  # nothing to wait for
    assert acl.rt.record_event(waited, healthy) == 0  # not "waited on since its last record"
    assert acl.rt.synchronize_event_with_timeout(waited, 2000) == 0
    assert acl.rt.destroy_stream(healthy) == 0
    for event in (recorded, waited):
        assert acl.rt.destroy_event(event) == 0


def test_stream_abort_drops_a_wait_for_an_event_at_once(acl, ctx, host_buffer, device_buffer):
    """A stream whose running task waits for an event (of a stream held by a hung copy) is
    aborted at once, as the device drops wait tasks: it waited for the wait's end (2 s, then
    507000). Found by an API-sequence fuzzer of the CPU runtime."""
    s1, _ = acl.rt.create_stream()
    s2, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    host, device = host_buffer(64), device_buffer(64)
    gate = threading.Event()
    hung = faults.inject("memcpy", nth=1, hold=gate)
    try:
        assert acl.rt.memcpy_async(host, 64, device, 64, C.ACL_MEMCPY_DEVICE_TO_HOST, s1) == 0
        assert acl.rt.record_event(event, s1) == 0
        assert acl.rt.stream_wait_event(s2, event) == 0
        assert acl.rt.memcpy_async(host, 64, device, 64, C.ACL_MEMCPY_DEVICE_TO_HOST, s2) == 0
        assert hung.entered.wait(10)
        host_wait = {}
        waiter = threading.Thread(
            target=lambda: host_wait.update(ret=acl.rt.synchronize_event_with_timeout(event, 1500)))
        waiter.start()
        wait_until_at(waiter, _stream.block)  # waiting on the event too
        assert acl.rt.stream_abort(s2) == 0
        assert acl.rt.synchronize_stream_with_timeout(s2, 1000) == C.ACL_ERROR_RT_STREAM_ABORT
        assert hung.seen == 1  # s2's copy was dropped
        waiter.join(10)
        # the host's wait on the event is not ended by the abort of another stream's wait on it
        assert host_wait == {"ret": C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT}
    finally:
        gate.set()
        faults.clear()
    assert acl.rt.synchronize_stream(s1) == 0
    for stream in (s1, s2):
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_event(event) == 0
