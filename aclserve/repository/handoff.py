"""Handoff: what a load thread makes, passed to the loop, unless the loop stopped waiting for it.

A load runs in a thread (it opens a pool and warms it up) while the loop awaits it. When the
loop stops waiting (the repository closes: the await is cancelled), the thread cannot be
stopped, but it can look (`given_up`) and stop early where it may (a warm-up between runs); what
it makes must still be closed by someone: by the thread, when it finishes
after the loop gave up, or by the loop, when the thread had finished but the loop was cancelled
before it took the result. The lock decides which, so it is closed exactly once.
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    def __init__(self):
        self._lock = threading.Lock()
        self._given_up = False
        self._delivered: T | None = None

    def deliver(self, value: T, dispose: Callable[[T], None]) -> T | None:
        """The thread, done: `value` for the loop; or, when the loop has given up, None after
        disposing of `value` here (blocking)."""
        with self._lock:
            if not self._given_up:
                self._delivered = value
                return value
        dispose(value)
        return None

    @property
    def given_up(self) -> bool:
        """The loop has stopped waiting: the thread's work is for nothing from here on."""
        return self._given_up

    def give_up(self) -> T | None:
        """The loop stops waiting: what the thread delivered already and the loop never took
        (the caller disposes of it), else None (the thread disposes of what it makes)."""
        with self._lock:
            self._given_up = True
            value, self._delivered = self._delivered, None
            return value
