"""Requests let in before they are read: what the connection guard's early refusals
(server/shedding.py) must count against the default level's room until the requests are read.

A request the guard lets through reaches the batcher only when its handler runs, after the loop
has read whatever else came meanwhile; a burst read in one pass of the loop would otherwise be
let through whole against the same free room. Requests naming no priority are admitted, and
those whose body is still coming (counted as of the default level, an estimate that errs high
for them only). Each admission counts until the next request read takes it
off (DynamicBatcher.request_read, from server/infer_pipeline.py: reads are not matched to admissions,
any read stands for the oldest one, so the count errs low, never high) or until LAPSE_S after
it was made, so one that is never read (a client gone) stops counting however many follow it.
A burst read in one pass still counts its invalid requests until they are read: the guard
cannot tell them from valid ones.
"""
from __future__ import annotations

import collections

LAPSE_S = 0.05  # admitted requests arrive within a pass or two of the loop


class UnreadAdmissions:
    """Owned by a DynamicBatcher; loop thread only. Times are the batcher's clock (seconds)."""

    __slots__ = ("_times",)

    def __init__(self):
        self._times: collections.deque[float] = collections.deque()  # oldest first

    def admit(self, room: int, now: float) -> bool:
        """Count one more if `room` (what the level can still take: requests, or rows where its
        bound counts rows, each unread request then counted as one) exceeds those still counted."""
        times = self._times
        while times and now - times[0] > LAPSE_S:
            times.popleft()
        if room <= len(times):
            return False
        times.append(now)
        return True

    def arrived(self) -> None:
        """A request was read: the oldest admission is no longer unread."""
        if self._times:
            self._times.popleft()
