"""Calls that older CANN releases lack, probed once per module, with the plain call as fallback.

`synchronize_event_with_timeout` / `synchronize_stream_with_timeout` (and `get_soc_name`) are
missing from older pyACL builds. Where they are absent, waits fall back to the untimed calls and
the log says once that a hung device can then block its instance for good.
"""
from __future__ import annotations

import logging
import threading

from .check import check

log = logging.getLogger(__name__)

_said: set[str] = set()
_said_lock = threading.Lock()


def _missing(acl, name: str) -> bool:
    if getattr(acl.rt, name, None) is not None:
        return False
    with _said_lock:
        if name not in _said:
            _said.add(name)
            log.warning("this CANN has no acl.rt.%s: waiting without a timeout instead "
                        "(a hung device then blocks its instance until it answers)", name)
    return True


def synchronize_event(acl, event: int, timeout_ms: int) -> None:
    """Wait for `event`, at most `timeout_ms` where CANN can time the wait (507047 on expiry)."""
    if _missing(acl, "synchronize_event_with_timeout"):
        check("rt.synchronize_event", acl.rt.synchronize_event(event))
    else:
        check("rt.synchronize_event_with_timeout", acl.rt.synchronize_event_with_timeout(event, timeout_ms))


def synchronize_stream(acl, stream: int, timeout_ms: int) -> None:
    """Wait for `stream`, at most `timeout_ms` where CANN can time the wait (AclError with
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT on expiry; the stream's own fault raises its code)."""
    if _missing(acl, "synchronize_stream_with_timeout"):
        check("rt.synchronize_stream", acl.rt.synchronize_stream(stream))
    else:
        check("rt.synchronize_stream_with_timeout", acl.rt.synchronize_stream_with_timeout(stream, timeout_ms))


def soc_name(acl) -> str | None:
    """acl.get_soc_name() where this CANN has it (it needs acl.init first), else None."""
    get = getattr(acl, "get_soc_name", None)
    if get is None:
        return None
    return get() or None
