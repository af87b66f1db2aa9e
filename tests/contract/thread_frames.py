"""Waiting for another thread to stand at a given point of the CPU runtime, read from its frame
(sys._current_frames): a condition, not a sleep, for tests that must act while a call waits."""
from __future__ import annotations

import inspect
import sys
import threading
import time

import pytest


def wait_until_at(thread: threading.Thread, fn, line: str | None = None, limit_s: float = 30.0) -> None:
    """Return once `thread`'s innermost Python frame is in `fn` (at its line reading `line`, when
    given): a lock or gate it waits for there is taken in C, which adds no frame. Fails the test
    past limit_s, or when the thread ended first."""
    target = None
    if line is not None:
        lines, first = inspect.getsourcelines(fn)
        target = first + next(i for i, text in enumerate(lines) if text.strip() == line)
    deadline = time.monotonic() + limit_s
    while True:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code is fn.__code__ and target in (None, frame.f_lineno):
            return
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail(f"the thread never stood in {fn.__qualname__}" + (f" at {line!r}" if line else ""))
        time.sleep(0.001)
