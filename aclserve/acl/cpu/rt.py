"""acl.rt for the CPU runtime: devices, contexts, streams, events, memory, callbacks.

Same names, argument order and returns as pyACL (values first, ret last; bare ret otherwise).
Blocking calls (synchronize_*, process_report) wait on threading primitives: they release the
GIL and do not poll.
"""
from __future__ import annotations

from ...soc_families import SocFamily, soc_family
from .. import constants as C
from . import _state, settings
from ._args import INT, PTR, api
from ._state import Context
from ._rt_events import wait_timeout
from ._rt_events import (  # noqa: F401  (events and callbacks)
    create_event, create_event_with_flag, create_event_ex_with_flag, destroy_event, record_event,
    stream_wait_event, reset_event,
    synchronize_event, synchronize_event_with_timeout, query_event_status, query_event, event_elapsed_time,
    subscribe_report, unsubscribe_report, launch_callback, process_report,
)
from ._rt_memory import (  # noqa: F401  (memory)
    malloc, malloc_align32, free, malloc_host, free_host,
    memcpy, memcpy_async, memset, memset_async, get_mem_info,
)
from ._stream import Stream

_OK = C.ACL_SUCCESS


# -- devices and contexts ------------------------------------------------------------------------
@api("acl.rt.set_device", INT)
def set_device(device_id):
    ret = _state.check_init()
    if ret:
        return ret
    with _state.lock:
        device = _state.devices.get(device_id)
        if device is None:
            return C.ACL_ERROR_RT_INVALID_DEVICEID
        device.refcount += 1
        if device.default_context is None:
            device.default_context = Context(device_id, is_default=True)
        _state.bind(device.default_context)
    return _OK


@api("acl.rt.reset_device", INT)
def reset_device(device_id):
    ret = _state.check_init()
    if ret:
        return ret
    with _state.lock:
        device = _state.devices.get(device_id)
        if device is None:
            return C.ACL_ERROR_RT_INVALID_DEVICEID
        device.refcount = max(device.refcount - 1, 0)
        ctx = device.default_context if device.refcount == 0 else None
        if ctx is not None:
            device.default_context = None
        _state.released_if_unused(device_id)  # a failure of the whole device goes with its last user
    if ctx is not None:
        ctx.close()
    return _OK


@api("acl.rt.get_device")
def get_device():
    ctx, ret = _state.current()
    return (ctx.device, _OK) if ctx else (0, ret)


@api("acl.rt.get_device_count")
def get_device_count():
    return _state.device_count(), _OK


@api("acl.rt.get_run_mode")
def get_run_mode():
    return _state.run_mode, _OK


@api("acl.rt.create_context", INT)
def create_context(device_id):
    ret = _state.check_init()
    if ret:
        return 0, ret
    if device_id not in _state.devices:
        return 0, C.ACL_ERROR_RT_INVALID_DEVICEID
    with _state.lock:
        if not _state.stream_room(device_id, _state.context_streams()):  # its default (and internal) streams
            return 0, C.ACL_ERROR_RT_NO_STREAM_RESOURCE
        ctx = Context(device_id, is_default=False)
        _state.contexts[ctx.handle] = ctx
    _state.bind(ctx)
    return ctx.handle, _OK


@api("acl.rt.destroy_context", PTR)
def destroy_context(context):
    ret = _state.check_init()
    if ret:
        return ret
    if context == 0:
        return C.ACL_ERROR_INVALID_PARAM
    with _state.lock:
        ctx = _state.contexts.pop(context, None)
        if ctx is not None:
            _state.released_if_unused(ctx.device)
    if ctx is None:
        return C.ACL_ERROR_RT_PARAM_INVALID  # unknown, or a default context (not destroyable)
    ctx.close()
    return _OK


def _find_context(handle: int):
    ctx = _state.contexts.get(handle)
    if ctx is None:
        ctx = next((d.default_context for d in _state.devices.values()
                    if d.default_context is not None and d.default_context.handle == handle), None)
    return ctx


@api("acl.rt.set_context", PTR)
def set_context(context):
    ret = _state.check_init()
    if ret:
        return ret
    if context == 0:
        return C.ACL_ERROR_INVALID_PARAM
    ctx = _find_context(context)
    if ctx is None:
        return C.ACL_ERROR_RT_PARAM_INVALID
    _state.bind(ctx)
    return _OK


@api("acl.rt.get_context")
def get_context():
    ctx, ret = _state.current()
    return (ctx.handle, _OK) if ctx else (0, ret)


# -- streams -------------------------------------------------------------------------------------
@api("acl.rt.create_stream")
def create_stream():
    ctx, ret = _state.current()
    if ret:
        return 0, ret
    with _state.lock:
        if not ctx.alive:  # destroyed by another thread since current(): as if it had been first
            return 0, C.ACL_ERROR_RT_CONTEXT_NULL
        if not _state.stream_room(ctx.device):
            return 0, C.ACL_ERROR_RT_NO_STREAM_RESOURCE
        stream = Stream(_state.new_handle(), ctx)
        _state.streams[stream.handle] = stream
    return stream.handle, _OK


@api("acl.rt.destroy_stream", PTR)
def destroy_stream(stream):
    ctx, ret = _state.current()
    if ret:
        return ret
    if stream == 0:
        return C.ACL_ERROR_INVALID_PARAM
    with _state.lock:
        s = _state.streams.get(stream)
        if s is None:
            return C.ACL_ERROR_RT_PARAM_INVALID
        if s.context is not ctx:
            return C.ACL_ERROR_RT_STREAM_CONTEXT
        del _state.streams[stream]
    s.close()  # lets queued work finish, as the device would
    return _OK


@api("acl.rt.set_stream_failure_mode", PTR, INT)
def set_stream_failure_mode(stream, mode):
    """Not for the default stream (0), nor on the Atlas 200/300/500 (CANN: not supported;
    which code it gives is not documented: 207000 here)."""
    ctx, ret = _state.current()
    if ret:
        return ret
    if _state.no_failure_mode:
        return C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    if stream == 0 or mode not in (C.ACL_CONTINUE_ON_FAILURE, C.ACL_STOP_ON_FAILURE):
        return C.ACL_ERROR_INVALID_PARAM
    s, ret = _state.stream_of(stream, ctx)
    return ret or s.set_failure_mode(mode)


_ABORTING_FAMILIES = (SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)  # aclrtStreamAbort's "产品支持情况" ticks


@api("acl.rt.stream_abort", PTR)
def stream_abort(stream):
    """Drop a stream's queued work, wait for its running task (_stream.Stream.abort). Not for
    the default stream (0); on the A2/A3 series only (CANN's aclrtStreamAbort page: not the
    200I/500 A2, the Atlas inference series nor the training series, whose Ascend910B is no A2;
    which code they give is not documented: 207000 here)."""
    ctx, ret = _state.current()
    if ret:
        return ret
    if _state.soc_name != settings.DEFAULT_SOC and soc_family(_state.soc_name) not in _ABORTING_FAMILIES:
        return C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    if stream == 0:
        return C.ACL_ERROR_INVALID_PARAM
    s, ret = _state.stream_of(stream, ctx)
    return ret or s.abort()


def _sync(stream: int, ms: int):
    ctx, ret = _state.current()
    if ret:
        return ret
    timeout, ret = wait_timeout(ms, event=False)
    if ret:
        return ret
    s, ret = _state.stream_to_sync(stream, ctx)
    return ret or s.synchronize(timeout)


@api("acl.rt.synchronize_stream", PTR)
def synchronize_stream(stream):
    return _sync(stream, -1)


@api("acl.rt.synchronize_stream_with_timeout", PTR, INT)
def synchronize_stream_with_timeout(stream, timeout_ms):
    return _sync(stream, timeout_ms)


@api("acl.rt.synchronize_device")
def synchronize_device():
    ctx, ret = _state.current()
    if ret:
        return ret
    with _state.lock:
        owned = [s for s in _state.streams.values() if s.device == ctx.device]
    owned.append(ctx.default_stream())
    errors = [s.synchronize() for s in owned]
    return next((e for e in errors if e), _OK)
