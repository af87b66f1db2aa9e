"""The time source and timer service of the scheduler (injectable so tests need no sleeps)."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic seconds plus one-shot timers, all used on the event loop thread only."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...


class LoopClock:
    """The production clock: the event loop's monotonic time and its timer heap.

    Timers are `loop.call_at` handles, so a deadline fires at its moment even while every
    executor slot is busy (no polling, nothing waits on the device)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self._loop.call_at(when, callback, *args)
