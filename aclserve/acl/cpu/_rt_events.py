"""acl.rt events and host callbacks (re-exported by rt.py)."""
from __future__ import annotations

from .. import constants as C
from . import _callback, _event_pool, _state
from ._args import ANY, FUNC, INT, PTR, api
from ._stream import Event

_OK = C.ACL_SUCCESS


def wait_timeout(ms: int, event: bool) -> tuple[float | None, int]:
    """(seconds or None for -1: forever, ret) of a *_with_timeout wait, checked before its
    handle as the runtime does: [-1, INT_MAX] (below, ACL_ERROR_RT_PARAM_INVALID), and, for an
    `event` wait, a SoC that cannot time it (the Ascend310: Atlas 200/300/500,
    settings.soc_name) refuses any other timeout than -1 (ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    here: which code the device gives is not documented)."""
    if ms == -1:
        return None, _OK
    if ms < 0:
        return None, C.ACL_ERROR_RT_PARAM_INVALID
    if event and _state.untimed_event_waits:
        return None, C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    return ms / 1000.0, _OK


# -- events --------------------------------------------------------------------------------------
@api("acl.rt.create_event")
def create_event():
    """Not limited by the device's events: each record takes one (_event_pool.py)."""
    return _create(None, at_record=True)


def _flags_ok(flag: int, allowed: int, alone: int) -> bool:
    """A non-empty set of `allowed` flags, where `alone` is not OR-ed with another."""
    return bool(flag) and not flag & ~allowed and (not flag & alone or flag == alone)


_EX_FLAGS = C.ACL_EVENT_SYNC | C.ACL_EVENT_CAPTURE_STREAM_PROGRESS | C.ACL_EVENT_TIME_LINE | C.ACL_EVENT_IPC


@api("acl.rt.create_event_ex_with_flag", INT)
def create_event_ex_with_flag(flag):
    """An event that may be recorded again, each record replacing the last (CANN). Not limited
    by the device's events ("Event资源不受硬件限制"): with ACL_EVENT_SYNC each record takes one
    (_event_pool.py). ACL_EVENT_IPC goes alone (CANN)."""
    if not _flags_ok(flag, _EX_FLAGS, C.ACL_EVENT_IPC):
        return 0, C.ACL_ERROR_INVALID_PARAM
    return _create(flag, reusable=True, at_record=bool(flag & C.ACL_EVENT_SYNC))


def _create(flags, reusable: bool = False, at_record: bool = False, at_creation: bool = False):
    """An event that takes the device's event resources `at_record` (each record), `at_creation`
    (one, 207007 when none is left), or none."""
    ctx, ret = _state.current()
    if ret:
        return 0, ret
    with _state.lock:
        if not ctx.alive:  # destroyed by another thread since current(): as if it had been first
            return 0, C.ACL_ERROR_RT_CONTEXT_NULL
        pool = _state.devices[ctx.device].event_pool
        holding = taken = None
        if at_creation:
            if not pool.take():
                return 0, C.ACL_ERROR_RT_NO_EVENT_RESOURCE
            taken = _event_pool.Taken(pool)
        elif at_record:
            holding = _event_pool.Holding(pool, kept_until_next_record=flags is None)
        event = Event(_state.new_handle(), ctx, flags, reusable, holding, taken)
        _state.events[event.handle] = event
    return event.handle, _OK


_FLAGS = (C.ACL_EVENT_SYNC | C.ACL_EVENT_CAPTURE_STREAM_PROGRESS | C.ACL_EVENT_TIME_LINE
          | C.ACL_EVENT_DEVICE_USE_ONLY | C.ACL_EVENT_EXTERNAL)


@api("acl.rt.create_event_with_flag", INT)
def create_event_with_flag(flag):
    """An event for what its flags say (CANN): waited on by a stream, or reset, only with
    ACL_EVENT_SYNC; timed only with ACL_EVENT_TIME_LINE; ACL_EVENT_EXTERNAL goes alone. With
    ACL_EVENT_SYNC or ACL_EVENT_EXTERNAL it takes one of the device's events as it is made
    ("创建出来的Event数量受限": 207007 when none is left); without, none ("Event数量不受限制")."""
    if not _flags_ok(flag, _FLAGS, C.ACL_EVENT_EXTERNAL):
        return 0, C.ACL_ERROR_INVALID_PARAM
    return _create(flag, at_creation=bool(flag & (C.ACL_EVENT_SYNC | C.ACL_EVENT_EXTERNAL)))


# Waiting on, querying, timing and destroying an event need no current context (CANN looks at
# the event alone: _state.event_anywhere); recording and waiting on it from a stream do.
@api("acl.rt.destroy_event", PTR)
def destroy_event(event):
    e, ret = _state.event_anywhere(event)
    if ret:
        return ret
    with _state.lock:
        gone = _state.events.pop(event, None)
    if gone is not None:
        gone.destroyed()
    return _OK


def _event_and_stream(event: int, stream: int):
    ctx, ret = _state.current()
    if ret:
        return None, None, ret
    e, ret = _state.event_of(event, ctx)
    if ret:
        return None, None, ret
    s, ret = _state.stream_of(stream, ctx)
    return e, s, ret


# What CANN documents and the device does not refuse (it runs wrongly, or leaks the event's
# resources): refused here with 107000, so that the mistake shows before a device runs it.
_MISUSE = C.ACL_ERROR_RT_PARAM_INVALID
# What the device refuses for an event of create_event_ex_with_flag ("new mode"): reset_event and
# the old query_event (hicann/runtime src/runtime/api/impl/api_impl.cc ApiImpl::EventReset and
# api_error.cc ApiErrorDecorator::EventQuery: evt->IsNewMode() -> RT_ERROR_FEATURE_NOT_SUPPORT)
_NEW_MODE = C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


@api("acl.rt.record_event", PTR, PTR)
def record_event(event, stream):
    """An event that a stream waited on is recorded again only after reset_event (CANN:
    create, record, wait, reset), but for create_event_ex_with_flag's, recorded again as they
    are."""
    e, s, ret = _event_and_stream(event, stream)
    if ret:
        return ret
    if e.waited:
        return _MISUSE
    return e.record(s)


@api("acl.rt.stream_wait_event", PTR, PTR)
def stream_wait_event(stream, event):
    """An event made with flags is waited on by a stream only with ACL_EVENT_SYNC."""
    e, s, ret = _event_and_stream(event, stream)
    if ret:
        return ret
    if e.flags is not None and not e.flags & C.ACL_EVENT_SYNC:
        return _MISUSE
    ret = e.queue_wait(s)
    if ret == _OK and not e.reusable:  # (a wait the stream refused has not waited)
        e.waited = True
    return ret


@api("acl.rt.reset_event", PTR, PTR)
def reset_event(event, stream):
    """Reset an event once the stream that waited on it gets here (queued on `stream`): it may
    then be recorded again. Refused for the events of create_event_ex_with_flag (CANN) with the
    device's code, and for those of create_event_with_flag without ACL_EVENT_SYNC."""
    e, s, ret = _event_and_stream(event, stream)
    if ret:
        return ret
    if e.reusable:
        return _NEW_MODE
    if e.flags is not None and not e.flags & C.ACL_EVENT_SYNC:
        return _MISUSE
    e.waited = False
    return s.enqueue(e.reset, marker=True)


def _event_wait(event: int, ms: int):
    ret = _state.check_init()
    if ret:
        return ret
    timeout, ret = wait_timeout(ms, event=True)
    if ret:
        return ret
    e, ret = _state.event_anywhere(event)
    if ret:
        return ret
    # its context stopped on a failure: CANN checks that before the wait and while it waits;
    # here before and after it (a wait behind a hung task ends at its timeout)
    if e.context.failure:
        return e.context.failure_told()
    if not e.wait(timeout):
        return C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
    # a failure of the work before it is not reported here, but in stop-on-failure mode
    return e.context.failure_told()


@api("acl.rt.synchronize_event", PTR)
def synchronize_event(event):
    return _event_wait(event, -1)


@api("acl.rt.synchronize_event_with_timeout", PTR, INT)
def synchronize_event_with_timeout(event, timeout_ms):
    return _event_wait(event, timeout_ms)


@api("acl.rt.query_event_status", PTR)
def query_event_status(event):
    """(ACL_EVENT_RECORDED_STATUS_COMPLETE=1 | NOT_READY=0, ret); a never-recorded event is
    complete. In a context stopped on a failure, that failure (CANN checks the context first)."""
    e, ret = _state.event_anywhere(event)
    if ret:
        return 0, ret
    if e.context.failure:
        return 0, e.context.failure_told()
    return (C.ACL_EVENT_RECORDED_STATUS_COMPLETE if e.complete() else C.ACL_EVENT_RECORDED_STATUS_NOT_READY), _OK


@api("acl.rt.query_event", PTR)
def query_event(event):
    """Deprecated aclrtQueryEvent: the opposite encoding (COMPLETE=0, NOT_READY=1); refused for
    an event of create_event_ex_with_flag (CANN), as the device refuses it (_NEW_MODE)."""
    e = _state.events.get(event)
    if e is not None and e.reusable:
        return 0, _NEW_MODE
    status, ret = query_event_status(event)
    return (0 if status == C.ACL_EVENT_RECORDED_STATUS_COMPLETE else 1), ret


@api("acl.rt.event_elapsed_time", PTR, PTR)
def event_elapsed_time(start, end):
    e1, ret1 = _state.event_anywhere(start)
    e2, ret2 = _state.event_anywhere(end)
    if ret1 or ret2:
        return 0.0, ret1 or ret2
    if any(e.flags is not None and not e.flags & C.ACL_EVENT_TIME_LINE for e in (e1, e2)):
        return 0.0, _MISUSE  # an event made with flags records a time only with TIME_LINE
    t1, t2 = e1.finished_timestamp(), e2.finished_timestamp()
    if t1 is None or t2 is None:
        return 0.0, C.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID  # not recorded, or not completed yet
    if e1.stream is not e2.stream:
        # CANN times two events recorded "in the same Stream" (hicann/runtime
        # docs/zh/api_ref/07_event_management.md, aclrtEventElapsedTime); its runtime does not check
        # (Event::ElapsedTime subtracts the timestamps), so a pair across streams is a _MISUSE here
        return 0.0, _MISUSE
    if t2 < t1:
        return 0.0, C.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL
    return (t2 - t1) * 1000.0, _OK


# -- callbacks -----------------------------------------------------------------------------------
def _stream_for_report(stream: int):
    ctx, ret = _state.current()
    if ret:
        return None, ret
    return _state.stream_of(stream, ctx)


@api("acl.rt.subscribe_report", PTR, PTR)
def subscribe_report(thread_id, stream):
    s, ret = _stream_for_report(stream)
    return ret or _callback.subscribe(thread_id, s)


@api("acl.rt.unsubscribe_report", PTR, PTR)
def unsubscribe_report(thread_id, stream):
    s, ret = _stream_for_report(stream)
    return ret or _callback.unsubscribe(thread_id, s)


@api("acl.rt.launch_callback", FUNC, ANY, INT, PTR)
def launch_callback(fn, user_data, block_type, stream):
    if block_type not in (C.ACL_CALLBACK_NO_BLOCK, C.ACL_CALLBACK_BLOCK):
        return C.ACL_ERROR_INVALID_PARAM
    s, ret = _stream_for_report(stream)
    return ret or _callback.launch(fn, user_data, block_type == C.ACL_CALLBACK_BLOCK, s)


@api("acl.rt.process_report", INT)
def process_report(timeout_ms):
    ret = _state.check_init()
    if ret:
        return ret
    if timeout_ms == 0 or timeout_ms < -1:
        return C.ACL_ERROR_INVALID_PARAM
    return _callback.process(timeout_ms)
