"""Device event times on the host's clock, for the timeline of traced batches.

pyACL gives durations between two events (`event_elapsed_time`), not absolute times, and only
between two events recorded on one stream (CANN's aclrtEventElapsedTime page; the CPU runtime
refuses other pairs). So the clock anchors each of the instance's streams on that stream:
`refresh()` records a spare event on each in turn, synchronizes it and takes
`time.perf_counter_ns()` right after, so each anchor's device time is known on the host's axis,
late by at most one wake-up of the waiting thread. A batch's phase is then placed from the
anchor of the stream its events were recorded on (event_times.phase_stream): anchor +
elapsed(anchor, event), or anchor - elapsed(event, anchor) for an event before it (a batch
launched before a refresh).

Each measured batch tightens the anchors, only ever moving them back (each is late, never
early): its last event completed before the completion thread woke, and a pipelined batch's
compute started after its copy-in ended and ended before its copy-out began (each stream waits
on the one before). Moving a stream's anchor back moves those of the streams before it in that
order (STREAM_ORDER) by as much, so the batches placed earlier keep their order across streams.
Batches keep Anchor objects, not host times, so a correction moves every batch of that anchor
together. Two events per stream, so a refresh never disturbs a reader of the current anchors.

Elapsed times are float milliseconds (float32 on CANN): the anchors are refreshed every
REFRESH_S while tracing, and when the instance's streams were made again, keeping them within a
microsecond or two. Create, use and close it with the instance's context current; only traced
batches call it.
"""
from __future__ import annotations

import threading
import time

from ..acl import AclError, check, compat, release
from ..acl import constants as C
from ..trace.records import Anchor
from .event_times import phase_stream

REFRESH_S = 20.0
STREAM_ORDER = ("h2d", "compute", "d2h")  # a pipelined batch's streams: each waits on the one before
EVENTS = 2 * len(STREAM_ORDER)  # two per stream (runtime/limits.py counts them)


class DeviceClock:
    """Owns two events per stream role of the instance's context."""

    def __init__(self, acl):
        self._acl = acl
        self._lock = threading.Lock()
        self._events: list[dict[str, int]] = [{}, {}]  # two sets, stream role -> event
        try:
            for events in self._events:
                for role in STREAM_ORDER:
                    events[role] = check("rt.create_event", acl.rt.create_event())
        except BaseException:
            self.close()  # (those made so far)
            raise
        self._current = -1  # index of the anchored set; -1 until the first refresh
        self._anchors: dict[str, Anchor] = {}  # stream role -> its anchor's host time
        self._streams: dict[str, int] = {}  # the stream handles anchored
        self._anchored_ns = 0

    def refresh_if_stale(self, streams: dict[str, int], timeout_ms: int = 60_000) -> None:
        """Anchor again when never anchored, older than REFRESH_S, or anchored on streams since
        replaced. Blocks until each stream has run what was queued on it before (a batch's
        compute and copy-out at most; AclError past `timeout_ms` on one, the model's execution
        timeout): call it from the launcher thread, before recording the batch's events."""
        if (not self._anchors or time.perf_counter_ns() - self._anchored_ns > REFRESH_S * 1e9
                or self._streams != streams):
            self.refresh(streams, timeout_ms)

    def refresh(self, streams: dict[str, int], timeout_ms: int = 60_000) -> None:
        spare = 1 - self._current if self._current >= 0 else 0
        anchors = {}
        for role in STREAM_ORDER:
            event = self._events[spare][role]
            check("rt.record_event", self._acl.rt.record_event(event, streams[role]))
            compat.synchronize_event(self._acl, event, timeout_ms)
            anchors[role] = Anchor(time.perf_counter_ns())
        with self._lock:
            self._current, self._anchors, self._streams = spare, anchors, dict(streams)
            self._anchored_ns = anchors[STREAM_ORDER[0]].host_ns

    def spans(self, pairs: dict[str, tuple[int, int]], direct: bool, done_by_ns: int
              ) -> tuple[dict[str, Anchor], dict[str, tuple[int, int]]]:
        """Per phase name, the anchor of the stream it ran on and the (start, end) offsets in ns
        from it of its pair of completed events (event_times.phase_events; pairs the device
        would not time are left out). `done_by_ns` is a host time known to be after the last of
        them (the completion thread's wake-up), which tightens the anchors. Completion thread only."""
        with self._lock:
            anchors = self._anchors
            events = self._events[self._current] if self._current >= 0 else {}
        on: dict[str, str] = {}  # phase name -> the stream role it ran on
        offsets: dict[str, tuple[int, int]] = {}
        for name, (start, end) in pairs.items():
            role = phase_stream(name, direct)
            if role not in anchors:
                continue
            a, b = self._offset_ns(events[role], start), self._offset_ns(events[role], end)
            if a is not None and b is not None:
                on[name], offsets[name] = role, (a, b)
        self._tighten(anchors, on, offsets, done_by_ns)
        return {name: anchors[role] for name, role in on.items()}, offsets

    @staticmethod
    def _tighten(anchors: dict[str, Anchor], on: dict[str, str], offsets: dict[str, tuple[int, int]],
                 done_by_ns: int) -> None:
        """Move anchors back where this batch shows them late: a phase ending after done_by_ns,
        or (phases on two streams) a phase ending after the next one began."""
        def move_back(role: str, to_ns: int) -> None:
            late = anchors[role].host_ns - to_ns
            if late > 0:
                for earlier in STREAM_ORDER[:STREAM_ORDER.index(role) + 1]:
                    anchors[earlier].host_ns -= late

        for role in reversed(STREAM_ORDER):
            ends = [offsets[name][1] for name in offsets if on[name] == role]
            if ends:
                move_back(role, done_by_ns - max(ends))
        # a pipelined batch's compute began after its copy-in ended, its copy-out after the compute ended
        for before, after in (("compute", "d2h"), ("h2d", "compute")):
            if before in on and after in on and on[before] != on[after]:
                move_back(on[before], anchors[on[after]].host_ns + offsets[after][0] - offsets[before][1])

    def _offset_ns(self, anchor: int, event: int) -> int | None:
        """Nanoseconds from `anchor` to `event` (recorded on one stream); None when the device
        will not time the pair."""
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
        sets, self._events = self._events, []
        for events in sets:
            for event in events.values():
                release("rt.destroy_event", self._acl.rt.destroy_event(event))
