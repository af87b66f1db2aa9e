"""Device event times on the host's clock, for the timeline of traced batches.

pyACL gives durations between two events (`event_elapsed_time`), not absolute times. The clock
owns two anchor events: `refresh()` records the spare one on a stream, synchronizes it and takes
`time.perf_counter_ns()` right after, so the anchor's device time is known on the host's axis,
late by at most one wake-up of the waiting thread. Each measured batch then tightens it: its last
event completed before the completion thread woke, so an anchor that would place it later is
moved back by the difference. Batches keep offsets from their Anchor object, not host times,
so a correction moves every batch of that anchor together. Any later event of the context is
then anchor + elapsed(anchor, event); an event before the anchor (a batch launched before a
refresh) is anchor - elapsed(event, anchor). Two events, so a refresh never disturbs a reader
of the current anchor.

Elapsed times are float milliseconds (float32 on CANN): the anchor is refreshed every
REFRESH_S while tracing, keeping them within a microsecond or two. Create, use and close it
with the instance's context current; only traced batches call it.
"""
from __future__ import annotations

import threading
import time

from ..acl import AclError, check, compat, release
from ..acl import constants as C
from ..trace.records import Anchor

REFRESH_S = 20.0


class DeviceClock:
    """Owns two events of the instance's context."""

    def __init__(self, acl):
        self._acl = acl
        self._lock = threading.Lock()
        self._events = [check("rt.create_event", acl.rt.create_event())]
        self._events.append(check("rt.create_event", acl.rt.create_event()))
        self._current = -1  # index of the anchored event; -1 until the first refresh
        self._anchor: Anchor | None = None

    def refresh_if_stale(self, stream: int, timeout_ms: int = 60_000) -> None:
        """Anchor again when never anchored or older than REFRESH_S. Blocks until `stream` has
        run what was queued before (a batch's compute at most; AclError past `timeout_ms`, the
        model's execution timeout): call it from the launcher thread, before recording the
        batch's events."""
        if self._anchor is None or time.perf_counter_ns() - self._anchor.host_ns > REFRESH_S * 1e9:
            self.refresh(stream, timeout_ms)

    def refresh(self, stream: int, timeout_ms: int = 60_000) -> None:
        spare = 1 - self._current if self._current >= 0 else 0
        event = self._events[spare]
        check("rt.record_event", self._acl.rt.record_event(event, stream))
        compat.synchronize_event(self._acl, event, timeout_ms)
        anchor = Anchor(time.perf_counter_ns())
        with self._lock:
            self._current, self._anchor = spare, anchor

    def spans(self, pairs: dict[str, tuple[int, int]], done_by_ns: int
              ) -> tuple[Anchor | None, dict[str, tuple[int, int]]]:
        """The anchor and, per name, the (start, end) offsets in ns from it of a pair of
        completed events (pairs the device would not time are left out); `done_by_ns` is a host
        time known to be after the last of them (the completion thread's wake-up), which
        tightens the anchor. Completion thread only."""
        with self._lock:
            anchor, event = self._anchor, self._events[self._current] if self._current >= 0 else 0
        if anchor is None:
            return None, {}
        offsets = {}
        for name, (start, end) in pairs.items():
            a, b = self._offset_ns(event, start), self._offset_ns(event, end)
            if a is not None and b is not None:
                offsets[name] = (a, b)
        latest = max((b for _, b in offsets.values()), default=None)
        if latest is not None and anchor.host_ns + latest > done_by_ns:
            anchor.host_ns = done_by_ns - latest
        return anchor, offsets

    def _offset_ns(self, anchor: int, event: int) -> int | None:
        """Nanoseconds from `anchor` to `event`; None when the device will not time the pair."""
        rt = self._acl.rt
        try:
            try:
                ms = check("rt.event_elapsed_time", rt.event_elapsed_time(anchor, event))
            except AclError as e:
                if e.ret != C.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL:
                    raise
                ms = -check("rt.event_elapsed_time", rt.event_elapsed_time(event, anchor))
        except AclError:
            return None
        return int(ms * 1e6)

    def close(self) -> None:
        """Destroy the events (the instance's context current). Safe twice."""
        events, self._events = self._events, []
        for event in events:
            release("rt.destroy_event", self._acl.rt.destroy_event(event))
