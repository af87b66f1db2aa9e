"""The time source and timer service of the scheduler (injectable so tests need no sleeps)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic seconds plus one-shot timers for scheduling (deadlines, batch windows), and
    monotonic nanoseconds for measuring durations (statistics, metrics, log messages); all used
    on the event loop thread only. The two need not share an origin: never mix their
    readings (a timer is set from a duration: queue.py's deadlines).

    now_ns() must read time.perf_counter_ns's timeline: the runtime stamps a batch's launch with
    it (runtime/launcher.py, the traces too), and a request's queue time is that stamp less its
    arrival by now_ns() (scheduling/delivery.py). A clock on another timeline (a test's manual
    one) gets the batch's dispatch instead where the launch stamp would come before it (a
    negative queue time), and meaningless queue and compute times otherwise."""

    def now(self) -> float: ...

    def now_ns(self) -> int: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...


class LoopClock:
    """The production clock: the event loop's monotonic time and its timer heap for scheduling,
    time.perf_counter_ns for durations: the runtime's clock too, whose stamp of a batch's launch
    ends its requests' queue time (scheduling/delivery.py), and the traces'.

    Timers are `loop.call_at` handles, so a deadline fires at its moment even while every
    executor slot is busy (no polling, nothing waits on the device). uvloop's loop.time()
    advances in whole milliseconds, too coarse to measure a request, hence now_ns()."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()

    now_ns = staticmethod(time.perf_counter_ns)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self._loop.call_at(when, callback, *args)
