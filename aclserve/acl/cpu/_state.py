"""Process-wide state of the CPU runtime: init/finalize, devices, contexts and handle registries.

The current context is per OS thread (threading.local), as in pyACL: a new thread starts with
none, set_device binds the device's default context, create_context/set_context bind theirs.
Handles are unique non-zero ints drawn from one counter, so a handle of the wrong kind or a
garbage value is simply not found. Everything here is guarded by one re-entrant lock; the hot
paths only read dicts.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading

from .. import constants as C
from .. import soc_limits
from ..compat import atlas_200_300_500, event_waits_forever_only
from . import _err_msg, _event_pool, _memory, faults, settings
from ._stream import Event, Stream

log = logging.getLogger("aclserve.acl.cpu")

lock = threading.RLock()
_handles = itertools.count(0x5AC1_0000_1000, 0x40)
_local = threading.local()
_finalizers: list = []

initialized = False
# On the board (ACL_DEVICE) malloc_host is the device's normal memory, not 64-byte aligned for
# certain (CANN's malloc_host docs): its blocks start 16 bytes past an aligned address here.
BOARD_HOST_OFFSET = 16
soc_name = settings.DEFAULT_SOC  # what acl.get_soc_name() answers (settings.soc_name, at init)
run_mode = C.ACL_HOST  # what acl.rt.get_run_mode() answers (settings.run_mode, at init)
untimed_event_waits = False  # the SoC cannot time an event wait (the Ascend310: compat.event_waits_forever_only)
no_failure_mode = False  # the SoC has no set_stream_failure_mode (the Ascend310 too: compat.atlas_200_300_500)
check_host = False  # memcpy_async checks its host side as it runs (settings.check_host, at init: _async_host.py)
devices: dict[int, "Device"] = {}
contexts: dict[int, "Context"] = {}
streams: dict[int, Stream] = {}
events: dict[int, Event] = {}


def new_handle() -> int:
    return next(_handles)


class Device:
    def __init__(self, device_id: int, max_streams: int, max_events: int):
        self.id = device_id
        self.refcount = 0
        self.default_context: Context | None = None
        self.max_streams, self.max_events = max_streams, max_events
        self.event_pool = _event_pool.EventPool(max_events)  # its event resources, taken at record_event
        # the code the device failed with as a whole (fail_device), 0 while it has not: every task
        # submitted in any of its contexts gets it, until the device is let go of (released_if_unused)
        self.status = 0


def fail_device(device_id: int, code: int) -> None:
    """The device failed as a whole with `code` (a `device` fault: faults.py), as CANN's
    ContextManage::SetGlobalFailureErr sets it on the device and on each of its contexts: those
    in stop-on-failure mode stop on it. The first code stays."""
    with lock:
        device = devices.get(device_id)
        if device is None or device.status:
            return
        device.status = code
        ctxs = [c for c in contexts.values() if c.device == device_id] + [device.default_context]
    log.info("CPU runtime: device %d failed as a whole with %d (an injected fault): every task on it "
                "fails until it is let go of", device_id, code)
    for ctx in ctxs:
        if ctx is not None:
            ctx.task_failed(code)


def released_if_unused(device_id: int) -> None:
    """Once no context of the device is left and reset_device has matched every set_device, its
    runtime Device is gone in CANN (a set_device then builds a clean one): its failure with it
    (hold `lock`)."""
    device = devices[device_id]
    if device.refcount == 0 and device.default_context is None and \
            not any(c.device == device_id for c in contexts.values()):
        device.status = 0


faults.device_failed = fail_device


INTERNAL_STREAMS = 1  # the runtime's own synchronisation stream, counted against the limit


def context_streams() -> int:
    """Streams a create_context context holds on the SoC presented: 2 (its default one and one for
    internal synchronisation) on the 310-class, else 1 (soc_limits.context_streams)."""
    return soc_limits.context_streams(soc_name)


def streams_in_use(device: int) -> int:
    """Explicit streams + each created context's (context_streams) + the default context's default
    stream + the internal one (hold `lock`)."""
    dev = devices[device]
    created = sum(1 for c in contexts.values() if c.device == device) * context_streams()
    ctxs = created + (dev.default_context is not None)
    return sum(1 for s in streams.values() if s.device == device) + ctxs + INTERNAL_STREAMS


def stream_room(device: int, more: int = 1) -> bool:
    """Whether `more` streams (or contexts, each bringing a default stream) still fit (hold `lock`)."""
    return streams_in_use(device) + more <= devices[device].max_streams


class Context:
    """A device context: owns the streams and events created under it and its default stream."""

    def __init__(self, device: int, is_default: bool):
        self.handle = new_handle()
        self.device = device
        self._device = devices[device]  # (its status: refusal())
        self.is_default = is_default
        self.alive = True
        self._default_stream: Stream | None = None
        # set_stream_failure_mode(ACL_STOP_ON_FAILURE) on one of its streams: the first failure
        # of its streams' work stops them all (failure, then kept; _stream.py)
        self.stop_on_failure = False
        self.failure = 0
        self.failure_message: str | None = None  # what the task that stopped it said (acl.get_recent_err_msg)

    def refusal(self) -> int:
        """What a task submitted under it gets (0: it is taken): the code its device failed with
        as a whole (CANN's Context::CheckTaskSend checks the device first), else the failure it
        stopped on."""
        return self._device.status or self.failure

    def task_failed(self, code: int, message: str | None = None) -> None:
        """A task of its streams (or a synchronous execute) failed with `code`, saying `message`:
        in stop-on-failure mode the context stops, the first code (and message) stays, and the
        waits on its streams and events under way end with it (CANN: they check the context)."""
        if not self.stop_on_failure:
            return
        with lock:
            if self.failure:
                return
            self.failure_message = message  # (first: failure_told reads the code, then the message)
            self.failure = code
            own_streams, own_events = self._owned()
            waiting = own_streams + own_events
        if self._default_stream is not None:
            waiting.append(self._default_stream)
        for stream_or_event in waiting:
            stream_or_event.wake_waits()

    def failure_told(self) -> int:
        """The failure it stopped on (0: none), for a call of the calling thread to return: what
        the failed task said of it becomes the thread's error message (acl.get_recent_err_msg)."""
        code = self.failure
        if code and self.failure_message:
            _err_msg.report(self.failure_message)
        return code

    def _owned(self) -> tuple[list[Stream], list]:
        """The streams (not the default one) and events made under it (hold `lock`)."""
        return ([s for s in streams.values() if s.context is self],
                [e for e in events.values() if e.context is self])

    def default_stream(self) -> Stream:
        if self._default_stream is None:
            with lock:
                if self._default_stream is None:
                    self._default_stream = Stream(new_handle(), self)
        return self._default_stream

    def close(self, join_timeout_s: float | None = None) -> None:
        """Close its streams (draining them) and drop its events. Idempotent."""
        with lock:
            self.alive = False
            owned, own_events = self._owned()
            for s in owned:
                del streams[s.handle]
            for e in own_events:
                del events[e.handle]
                e.destroyed()  # (its resources back to the device: _event_pool.py)
            if self._default_stream is not None:
                owned.append(self._default_stream)
                self._default_stream = None
        for s in owned:
            s.close(join_timeout_s)


_early_finalizers: list = []


def on_finalize(fn, early: bool = False) -> None:
    """Register cleanup run by finalize before memory is released. Early ones run before streams
    are closed (releasing callbacks that streams may be blocked on); the others after."""
    (_early_finalizers if early else _finalizers).append(fn)


def _run(fns) -> None:
    for fn in fns:
        try:
            fn()
        except Exception:
            log.exception("CPU runtime: cleanup at finalize failed")


_fork_forgetters: list = []


def on_fork_child(fn) -> None:
    """Register what a forked child forgets of the parent's state (forget_in_child)."""
    _fork_forgetters.append(fn)


def forget_in_child() -> None:
    """A forked child starts as a fresh process would: not initialised, no devices, contexts,
    streams, events, memory or models (a device's driver state does not survive fork either, so
    the child inits afresh). Nothing of the parent's is closed: its threads are not in the child,
    and its locks may have been held by them at the fork, so they are made anew."""
    global initialized, lock, _local
    initialized, lock, _local = False, threading.RLock(), threading.local()
    for registry in (devices, contexts, streams, events):
        registry.clear()
    _memory.forget_in_child()
    for fn in _fork_forgetters:
        fn()


os.register_at_fork(after_in_child=forget_in_child)


def check_init() -> int:
    return C.ACL_SUCCESS if initialized else C.ACL_ERROR_UNINITIALIZE


def current():
    """(context, 0) for the calling thread, or (None, 100001 / 107002)."""
    if not initialized:
        return None, C.ACL_ERROR_UNINITIALIZE
    ctx = getattr(_local, "ctx", None)
    if ctx is None or not ctx.alive:
        return None, C.ACL_ERROR_RT_CONTEXT_NULL
    return ctx, C.ACL_SUCCESS


def bind(ctx: Context | None) -> None:
    _local.ctx = ctx


def stream_of(handle: int, ctx: Context):
    """Resolve a stream handle (0 = the context's default stream) for use under ctx: a stream
    created under another context is refused with 107003, as the device does."""
    if handle == 0:
        return ctx.default_stream(), C.ACL_SUCCESS
    stream = streams.get(handle)
    if stream is None:
        return None, C.ACL_ERROR_RT_PARAM_INVALID
    if stream.context is not ctx:  # another context, even of the same device: "stream not in current context"
        return None, C.ACL_ERROR_RT_STREAM_CONTEXT
    return stream, C.ACL_SUCCESS


def stream_to_sync(handle: int, ctx: Context):
    """Resolve a stream handle for a synchronize: one of another context is synchronized all the
    same (CANN's StreamSynchronize switches to the stream's context and back)."""
    stream = streams.get(handle) if handle else None
    return (stream, C.ACL_SUCCESS) if stream is not None else stream_of(handle, ctx)


def event_anywhere(handle: int):
    """Resolve an event handle for the calls that look at the event alone, whatever context the
    calling thread has, or none (CANN's EventSynchronize, EventQueryStatus, EventElapsedTime and
    EventDestroy do not read the current context)."""
    if not initialized:
        return None, C.ACL_ERROR_UNINITIALIZE
    event = events.get(handle) if handle else None
    if event is None:
        return None, C.ACL_ERROR_INVALID_PARAM if handle == 0 else C.ACL_ERROR_RT_PARAM_INVALID
    return event, C.ACL_SUCCESS


def event_of(handle: int, ctx: Context):
    """Resolve an event handle for work queued under ctx: one of another device is refused."""
    event, ret = event_anywhere(handle)
    if ret:
        return None, ret
    if event.device != ctx.device:
        return None, C.ACL_ERROR_RT_STREAM_CONTEXT
    return event, C.ACL_SUCCESS


def device_count() -> int:
    return len(devices) if initialized else settings.device_count()


def init() -> int:
    global initialized, soc_name, untimed_event_waits, no_failure_mode, run_mode, check_host
    with lock:
        if initialized:
            return C.ACL_ERROR_REPEAT_INITIALIZE
        settings.check_environment()  # ValueError naming a bad one (threads were read at a load: an "invalid OM")
        soc_name = settings.soc_name()
        untimed_event_waits = event_waits_forever_only(soc_name)
        no_failure_mode = atlas_200_300_500(soc_name)
        on_board = settings.run_mode() == "device"
        run_mode = C.ACL_DEVICE if on_board else C.ACL_HOST
        check_host = settings.check_host()
        count, capacity = settings.device_count(), settings.device_memory()
        max_streams, max_events = settings.max_streams(), settings.max_events()
        devices.clear()
        devices.update({d: Device(d, max_streams, max_events) for d in range(count)})
        _memory.reset(count, capacity, host_offset=BOARD_HOST_OFFSET if on_board else 0, host_is_device=on_board)
        faults.load_env()
        initialized = True
    log.debug("CPU runtime initialised: %d device(s) of %d bytes", count, capacity)
    return C.ACL_SUCCESS


def finalize() -> int:
    """Release everything: streams, contexts, models, subscriptions, memory (CANN's finalize
    does not; what was left is logged)."""
    global initialized
    with lock:
        if not initialized:
            return C.ACL_ERROR_REPEAT_FINALIZE
        initialized = False
        ctxs = list(contexts.values()) + [d.default_context for d in devices.values() if d.default_context]
        contexts.clear()
        for d in devices.values():
            d.default_context, d.refcount = None, 0
        left = (len(ctxs), len(streams), len(events))
    for d in devices.values():
        d.event_pool.close()  # records waiting for an event resource complete (before streams close)
    _run(_early_finalizers)
    for ctx in ctxs:
        ctx.close(join_timeout_s=5.0)
    _run(_finalizers)
    live = _memory.release_all()
    if live or any(left):
        # CANN's finalize releases none of these: on a device they stay until the process exits
        log.warning("finalize released what the application still held: %d context(s) (default ones "
                    "included), %d stream(s), %d event(s), %d allocation(s)", *left, live)
    return C.ACL_SUCCESS
