"""Which of an instance's slots are free, and whether the instance takes work at all.

The pool reserves a slot (`try_reserve`, never blocking) before it launches a batch there; the
completion thread returns it once the batch is answered (`return_slot`). The instance takes no
new batch while it must reset its streams after a device fault (until nothing else is in
flight), once it is out of rotation for good (`broken`: a batch past the execution timeout, a
context stopped on a failed batch, or a stream reset that failed; the pool builds a
replacement), or once its close has begun
(`closing`). Also kept here, for /metrics: the fraction of the last 10 s with work in flight
(`busy_fraction`) and the faults the device reported, by ACL error code (`faults`: one per
fault, however many batches in flight it failed: completer.py counts a stopped context's once).

ModelInstance is a SlotBook, so the pool's per-batch calls (free_count, try_reserve, reads of
`broken`) reach it without a forwarding call. Everything here is written under `lock`, the
instance's one lock, which also guards the launch hand-over (launcher.py: it reads `in_flight`
and `closing` in the same hold). `broken` is also read without it where a stale answer only
delays a decision by one batch (the pool's health checks, the completion thread's fail-fast).
"""
from __future__ import annotations

import collections
import threading

from .busy import BusyWindow
from .slot import Slot


class SlotBook:
    """Owns the free list of an instance's slots (not the slots: instance_resources.py), its
    health flags, its busy time and its fault counts, and the lock they are written under.
    Nothing here blocks beyond that lock."""

    def __init__(self, slots: list[Slot]):
        self.lock = threading.Lock()
        self._free: list[Slot] = list(slots)
        self.in_flight = 0
        self.overlapped = False  # two batches or more were in flight since it last had none
        self._needs_reset = False  # a device fault: reset the streams once nothing is in flight
        self.broken: str | None = None  # reason, once the instance is out of rotation for good
        self.faults: collections.Counter[int] = collections.Counter()  # the device's faults by ACL code
        self.closing = False  # close() has begun (the first caller does the work): no new batch
        self._busy = BusyWindow()  # the spans with work in flight

    def free_count(self) -> int:
        with self.lock:
            return 0 if self._needs_reset or self.broken or self.closing else len(self._free)

    def try_reserve(self, alone: bool = False) -> Slot | None:
        """A free slot, or None; `alone`: only while nothing is in flight (isolation.py)."""
        with self.lock:
            if self._needs_reset or self.broken or self.closing or not self._free or (alone and self.in_flight):
                return None
            if self.in_flight == 0:
                self._busy.begin()
            else:
                self.overlapped = True
            self.in_flight += 1
            return self._free.pop()

    def return_slot(self, slot: Slot) -> bool:
        """Put the slot back; True when a pending stream reset can run now (nothing in flight)."""
        with self.lock:
            self.in_flight -= 1
            self._free.append(slot)
            if self.in_flight == 0:
                self._busy.end()
                self.overlapped = False
            return self._needs_reset and self.in_flight == 0 and not self.closing and not self.broken

    def busy_fraction(self) -> float:
        """The fraction of the last 10 s with a batch in flight. Read-only: scrapes do not
        shorten each other's window."""
        return self._busy.fraction()  # (not under the instance's lock: a scrape holds no batch up)

    def restart_busy(self) -> None:
        """The busy time so far is not load (a warm-up's): count from now."""
        self._busy.restart()

    def continue_busy(self, predecessor: SlotBook) -> None:
        """Count the busy time on from `predecessor`'s window (the instance this one replaces)."""
        self._busy.continue_from(predecessor._busy)

    def count_failure(self, code: int | None, needs_reset: bool) -> None:
        """A batch failed, with ACL error `code` when it is a fault of the device's not counted yet
        (None: a stopped context's fault counted already, or no device error); `needs_reset`: the
        streams are reset once nothing else is in flight (no new batch until then)."""
        with self.lock:
            if code is not None:
                self.faults[code] += 1
            if needs_reset:
                self._needs_reset = True

    def fault_counts(self) -> dict[int, int]:
        """The device's faults by ACL error code (timeouts included), for /metrics. Any thread."""
        with self.lock:
            return dict(self.faults)

    def take_out_of_rotation(self, reason: str) -> None:
        """For good: the instance takes no more batches (those in flight still come back)."""
        with self.lock:
            self.broken = reason

    def reset_settled(self) -> None:
        """The pending stream reset is settled: done, or left out on a device failed as a whole
        (completer.py). The slots are offered again (free_count)."""
        with self.lock:
            self._needs_reset = False

    def forget_slots(self) -> None:
        """The slots are freed (the instance's release): nothing is left to reserve."""
        self._free = []
