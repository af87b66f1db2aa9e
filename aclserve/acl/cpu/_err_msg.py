"""acl.get_recent_err_msg: what the calls that failed in the calling thread say of their failure.

CANN keeps a description of each failed call for its thread (acl.init's err_msg_mode: thread level
by default) and get_recent_err_msg returns them, the newest first, and clears them. Here a run that
ONNX Runtime fails says why where it ran (_ort_failures.py), and a failed task's message travels
with its code (_stream.py, _state.Context) to each thread whose synchronize returns that code.
A thread keeps its KEPT newest messages: a caller that never asks holds no growing list.
"""
from __future__ import annotations

import threading

KEPT = 8

_local = threading.local()


def report(text: str) -> None:
    """The calling thread's call failed, and says `text` of it."""
    kept = _messages()
    kept.append(text)
    del kept[:-KEPT]
    _local.reported = reported() + 1


def reported() -> int:
    """How many messages the calling thread has reported (a call's own are those after it)."""
    return getattr(_local, "reported", 0)


def said_since(count: int) -> str | None:
    """The calling thread's newest message if it reported one since `count` (reported()), kept
    (a synchronous execute's, for its context); else None (an older one is another call's)."""
    kept = _messages()
    return kept[-1] if kept and reported() > count else None


def take() -> str | None:
    """The calling thread's messages, newest first, one a line; cleared. None when there are none."""
    kept = _messages()
    if not kept:
        return None
    text = "\n".join(reversed(kept))
    kept.clear()
    return text


def _messages() -> list[str]:
    kept = getattr(_local, "messages", None)
    if kept is None:
        kept = _local.messages = []
    return kept
