"""launch_callback / process_report: host callbacks run in the thread subscribed to a stream.

A subscribed thread (an `acl.util.start_thread` thread or any Python thread, by its ident) owns a
report queue. When a stream reaches a callback task it puts the report in the queue of the thread
subscribed to it; that thread runs it inside `process_report`. With block_type 1 the stream waits
until the callback has returned. Waits use Conditions/Events: no polling, GIL released.
"""
from __future__ import annotations

import logging
import threading
from collections import deque

from .. import constants as C
from . import _state

log = logging.getLogger("aclserve.acl.cpu")


class _Report:
    __slots__ = ("fn", "user_data", "stream", "done")

    def __init__(self, fn, user_data, stream):
        self.fn, self.user_data, self.stream = fn, user_data, stream
        self.done = threading.Event()


class _ReportQueue:
    def __init__(self):
        self.cond = threading.Condition()
        self.items: deque[_Report] = deque()
        self.streams: set[int] = set()


_lock = threading.Lock()
_queues: dict[int, _ReportQueue] = {}  # thread id -> its queue
_subscriber: dict[int, int] = {}  # stream handle -> thread id


def subscribe(tid: int, stream) -> int:
    with _lock:
        if stream.handle in _subscriber:
            return C.ACL_ERROR_RT_PARAM_INVALID  # one thread per stream
        _subscriber[stream.handle] = tid
        _queues.setdefault(tid, _ReportQueue()).streams.add(stream.handle)
    return C.ACL_SUCCESS


def unsubscribe(tid: int, stream) -> int:
    with _lock:
        if _subscriber.get(stream.handle) != tid:
            return C.ACL_ERROR_RT_THREAD_SUBSCRIBE
        del _subscriber[stream.handle]
        queue = _queues[tid]
        queue.streams.discard(stream.handle)
        if not queue.streams:
            del _queues[tid]
    _drop_pending(queue, stream.handle)
    return C.ACL_SUCCESS


def _drop_pending(queue: _ReportQueue, stream_handle: int | None) -> None:
    """Release reports nobody will process, so blocked streams do not hang."""
    with queue.cond:
        keep = deque()
        for report in queue.items:
            if stream_handle is None or report.stream == stream_handle:
                log.warning("callback %r dropped: its thread unsubscribed before processing it", report.fn)
                report.done.set()
            else:
                keep.append(report)
        queue.items = keep


def launch(fn, user_data, block: bool, stream) -> int:
    with _lock:
        if stream.handle not in _subscriber:
            return C.ACL_ERROR_RT_THREAD_SUBSCRIBE

    def task() -> int:
        with _lock:
            tid = _subscriber.get(stream.handle)
            queue = _queues.get(tid) if tid is not None else None
        if queue is None:
            log.warning("callback %r dropped: stream %#x has no subscribed thread", fn, stream.handle)
            return C.ACL_ERROR_RT_THREAD_SUBSCRIBE
        report = _Report(fn, user_data, stream.handle)
        with queue.cond:
            queue.items.append(report)
            queue.cond.notify_all()
        if block:
            report.done.wait()
        return C.ACL_SUCCESS

    return stream.enqueue(task)


def process(timeout_ms: int) -> int:
    with _lock:
        queue = _queues.get(threading.get_ident())
    if queue is None:
        return C.ACL_ERROR_RT_THREAD_SUBSCRIBE
    timeout_s = None if timeout_ms == -1 else timeout_ms / 1000.0
    with queue.cond:
        if not queue.cond.wait_for(lambda: queue.items, timeout_s):
            return C.ACL_ERROR_RT_REPORT_TIMEOUT
        report = queue.items.popleft()
    try:
        report.fn(report.user_data)
    except Exception:
        log.exception("callback %r raised", report.fn)
    finally:
        report.done.set()
    return C.ACL_SUCCESS


def _reset() -> None:
    with _lock:
        queues = list(_queues.values())
        _queues.clear()
        _subscriber.clear()
    for queue in queues:
        _drop_pending(queue, None)


_state.on_finalize(_reset, early=True)


def _forget_in_child() -> None:
    """The parent's report threads and subscriptions are not the child's (_state.forget_in_child)."""
    global _lock
    _lock = threading.Lock()
    _queues.clear()
    _subscriber.clear()
    _threads.clear()


# -- acl.util.start_thread / stop_thread ---------------------------------------------------
_threads: dict[int, tuple[threading.Thread, list]] = {}


def start_thread(fn, args) -> int:
    failure: list = []

    def body():
        try:
            fn(args)
        except BaseException as e:  # reported by stop_thread, as pyACL does
            log.exception("acl.util.start_thread: thread function raised")
            failure.append(e)

    thread = threading.Thread(target=body, name="acl-cpu-report-thread", daemon=True)
    thread.start()
    with _lock:
        _threads[thread.ident] = (thread, failure)
    return thread.ident


def stop_thread(tid: int) -> int:
    with _lock:
        entry = _threads.pop(tid, None)
    if entry is None:
        return C.ACL_ERROR_INVALID_PARAM
    thread, failure = entry
    thread.join()
    if failure:
        raise RuntimeError(f"acl.util.stop_thread: the thread function raised {failure[0]!r}")
    return C.ACL_SUCCESS


_state.on_fork_child(_forget_in_child)
