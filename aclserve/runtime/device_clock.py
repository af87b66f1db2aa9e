"""Device event times on the host's clock, for the timeline of traced batches.

pyACL gives durations between two events (`event_elapsed_time`), not absolute times. The clock
owns two anchor events: `refresh()` records the spare one on a stream, synchronizes it and takes
`time.perf_counter_ns()` right after, so the anchor's device time is known on the host's axis,
late by at most one wake-up of the waiting thread. Each placed batch then tightens it: its last
event completed before the completion thread woke, so an anchor that would place it later is
moved back by the difference. Any later event of the context is then anchor + elapsed(anchor, event);
an event before the anchor (a batch launched before a refresh) is anchor - elapsed(event,
anchor). Two events, so a refresh never disturbs a reader of the current anchor.

Elapsed times are float milliseconds (float32 on CANN): the anchor is refreshed every
REFRESH_S while tracing, keeping them within a microsecond or two. Create, use and close it
with the instance's context current; only traced batches call it.
"""
from __future__ import annotations

import threading
import time

from ..acl import AclError, check, compat
from ..acl import constants as C

REFRESH_S = 20.0


class DeviceClock:
    """Owns two events of the instance's context."""

    def __init__(self, acl):
        self._acl = acl
        self._lock = threading.Lock()
        self._events = [check("rt.create_event", acl.rt.create_event())]
        self._events.append(check("rt.create_event", acl.rt.create_event()))
        self._current = -1  # index of the anchored event; -1 until the first refresh
        self._host_ns = 0
        self._sync_timeout_ms = 60_000

    def refresh_if_stale(self, stream: int) -> None:
        """Anchor again when never anchored or older than REFRESH_S. Blocks until `stream` has
        run what was queued before (a batch's compute at most): call it from the launcher
        thread, before recording the batch's events."""
        if self._current < 0 or time.perf_counter_ns() - self._host_ns > REFRESH_S * 1e9:
            self.refresh(stream)

    def refresh(self, stream: int) -> None:
        spare = 1 - self._current if self._current >= 0 else 0
        event = self._events[spare]
        check("rt.record_event", self._acl.rt.record_event(event, stream))
        compat.synchronize_event(self._acl, event, self._sync_timeout_ms)
        host = time.perf_counter_ns()
        with self._lock:
            self._current, self._host_ns = spare, host

    def spans(self, pairs: list[tuple[int, int]], done_by_ns: int) -> list[tuple[int, int] | None]:
        """Host (start, end) of each (start event, end event) pair of completed events, or None
        for a pair the device would not time; `done_by_ns` is a host time known to be after
        the last of them (the completion thread's wake-up), which tightens the anchor."""
        with self._lock:
            if self._current < 0:
                return [None] * len(pairs)
            current, anchor, host = self._current, self._events[self._current], self._host_ns
        offsets = [(self._offset_ns(anchor, a), self._offset_ns(anchor, b)) for a, b in pairs]
        known = [(a, b) for a, b in offsets if a is not None and b is not None]
        latest = max((b for _, b in known), default=None)
        if latest is not None and host + latest > done_by_ns:
            with self._lock:
                if self._current == current:
                    self._host_ns = min(self._host_ns, done_by_ns - latest)
                host = self._host_ns if self._current == current else done_by_ns - latest
        return [(host + a, host + b) if a is not None and b is not None else None for a, b in offsets]

    def _offset_ns(self, anchor: int, event: int) -> int | None:
        rt = self._acl.rt
        ms, ret = rt.event_elapsed_time(anchor, event)
        if ret == C.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL:
            ms, ret = rt.event_elapsed_time(event, anchor)
            ms = -ms
        return int(ms * 1e6) if ret == C.ACL_SUCCESS else None

    def close(self) -> None:
        """Destroy the events (the instance's context current). Safe twice."""
        events, self._events = self._events, []
        for event in events:
            try:
                check("rt.destroy_event", self._acl.rt.destroy_event(event))
            except AclError:
                pass
