"""Calls that older CANN releases, or some SoCs, lack, with the plain call as fallback.

`synchronize_event_with_timeout` / `synchronize_stream_with_timeout` (and `get_soc_name`) are
missing from older pyACL builds, and the Atlas 200/300/500 (Ascend310) takes only -1 (forever)
as an event wait's timeout (CANN's API reference). There waits fall back to the untimed calls,
and the log says once that a hung device can then block its instance for good. Events that
streams wait on batch after batch come from `create_event_ex_with_flag` where there is one
(`pipeline_event`), streams stop on a failed task where `set_stream_failure_mode` is taken
(`stop_on_failure`), and a stopped context's streams are aborted where `stream_abort` is
(`abort_stream`). A failed wait carries what the device said of it where `get_recent_err_msg`
is (`told`).
"""
from __future__ import annotations

import logging
import threading

from ..soc_families import SocFamily, soc_family
from . import constants as C
from .check import AclError, check

log = logging.getLogger(__name__)

TIMED_WAITS = ("synchronize_event_with_timeout", "synchronize_stream_with_timeout")

_lock = threading.Lock()
_forever: dict[int, tuple] = {}  # id(acl) -> (acl, event waits untimed, stream waits untimed): probe()
_said: dict[int, tuple[object, set[str]]] = {}  # id(acl) -> (acl, the fallbacks logged for it)


def atlas_200_300_500(soc: str | None) -> bool:
    """Whether a SoC is the Atlas 200/300/500's Ascend310 (not the 310P or 310B)."""
    return soc_family(soc) is SocFamily.ATLAS_200_300_500


def event_waits_forever_only(soc: str | None) -> bool:
    """Whether a SoC cannot time an event wait: CANN's aclrtSynchronizeEventWithTimeout takes
    only -1 (forever) on the Atlas 200/300/500 (Ascend310; the 310P and 310B can time it; its
    stream waits can be timed). The CPU runtime follows it when it presents such a SoC."""
    return atlas_200_300_500(soc)


def probe(acl) -> tuple[bool, bool]:
    """Decide (after acl.init: the SoC is known then) whether this CANN and SoC can time an
    event wait and a stream wait, saying once in the log when not; the runtime calls it when
    it starts. Returns (event waits untimed, stream waits untimed)."""
    untimed = []
    for call, what in zip(TIMED_WAITS, ("an event", "a stream")):
        if getattr(acl.rt, call, None) is None:
            reason = f"this CANN has no acl.rt.{call}"
        elif what == "an event" and event_waits_forever_only(soc := soc_name(acl)):
            reason = f"the {soc} cannot time {what} wait (CANN: -1, forever, only)"
        else:
            reason = None
        untimed.append(reason is not None)
        if reason is not None and _first_time(acl, reason):
            log.warning("%s: waiting without a timeout instead (a hung device then blocks its instance "
                        "until it answers)", reason)
    with _lock:
        _forever[id(acl)] = (acl, *untimed)  # acl held: its id stays its own
    return untimed[0], untimed[1]


def _first_time(acl, reason: str) -> bool:
    """Whether `reason` is new for this acl module (each is logged once)."""
    with _lock:
        said = _said.setdefault(id(acl), (acl, set()))[1]
        new = reason not in said
        said.add(reason)
        return new


def _untimed(acl, which: int) -> bool:
    known = _forever.get(id(acl))
    return known[1 + which] if known is not None and known[0] is acl else probe(acl)[which]


def synchronize_event(acl, event: int, timeout_ms: int) -> None:
    """Wait for `event`, at most `timeout_ms` where CANN can time the wait (507047 on expiry)."""
    if _untimed(acl, 0):
        told(acl, "rt.synchronize_event", acl.rt.synchronize_event(event))
    else:
        told(acl, "rt.synchronize_event_with_timeout", acl.rt.synchronize_event_with_timeout(event, timeout_ms))


def synchronize_stream(acl, stream: int, timeout_ms: int) -> None:
    """Wait for `stream`, at most `timeout_ms` where CANN can time the wait (AclError with
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT on expiry; the stream's own fault raises its code)."""
    if _untimed(acl, 1):
        told(acl, "rt.synchronize_stream", acl.rt.synchronize_stream(stream))
    else:
        told(acl, "rt.synchronize_stream_with_timeout", acl.rt.synchronize_stream_with_timeout(stream, timeout_ms))


# the most of a device's message an error carries (what the device says of a failure: a few KB at most)
SAID_KEPT = 64 * 1024


def told(acl, api: str, ret: int) -> None:
    """check(api, ret), its AclError carrying what the device said of the failure: CANN keeps a
    message for each failed call of the thread (acl.get_recent_err_msg, which clears them; older
    pyACL builds lack it): GE's words for a model it refused to run, ONNX Runtime's on the CPU
    runtime (a model's failure on its data, or its header and graph disagreeing)."""
    try:
        check(api, ret)
    except AclError as e:
        raise e.told(recent_message(acl)) from None


def recent_message(acl) -> str | None:
    """acl.get_recent_err_msg() on one line, at most SAID_KEPT (an error's message shows less:
    check.SAID_CHARS; cut there, messages that differ only in the length of an id ended alike no
    more: repository/retry.py same_words); None where it says nothing or this pyACL has no such call."""
    get = getattr(acl, "get_recent_err_msg", None)
    try:
        said = get() if get is not None else None
    except Exception:  # (a call that is only there to explain another's failure must not fail in its place)
        return None
    said = " ".join(said.split()) if isinstance(said, str) else ""
    return said[:SAID_KEPT] or None


def soc_name(acl) -> str | None:
    """acl.get_soc_name() where this CANN has it (it needs acl.init first), else None."""
    get = getattr(acl, "get_soc_name", None)
    if get is None:
        return None
    return get() or None


def pipeline_event(acl) -> tuple[int, bool]:
    """(event, whether another stream may wait on it batch after batch) for a slot, which
    records its events again for every batch. create_event_ex_with_flag(SYNC | TIME_LINE) where
    this CANN and SoC have it (CANN: each record of such an event replaces the last, and a
    stream waits for the latest), True. Else a plain create_event, False: CANN documents a
    plain event's cross-stream use as record, wait, reset (older CANN have no other), so the
    slot keeps all of a batch's work on one stream (enqueue.direct), which the log says once."""
    create = getattr(acl.rt, "create_event_ex_with_flag", None)
    ret = None
    if create is not None:
        result = create(C.ACL_EVENT_SYNC | C.ACL_EVENT_TIME_LINE)
        ret = result[-1]
        if ret == C.ACL_SUCCESS:  # (never refused for want of events: CANN takes them at record_event)
            return check("rt.create_event_ex_with_flag", result), True
    _fall_back(acl, "create_event_ex_with_flag", ret,
               "each batch runs its copies and execution on one stream (no copy/compute overlap between batches)")
    return check("rt.create_event", acl.rt.create_event()), False


def stop_on_failure(acl, stream: int) -> bool:
    """Set `stream` to ACL_STOP_ON_FAILURE: True where this CANN and SoC take it. In CANN's
    default mode a failed task does not fail the synchronize of an event recorded after it (the
    stream runs on: hicann/runtime's event synchronize checks only the context's stop state), so
    a batch's events alone cannot tell a failed execution from a good one; in stop mode they
    report it, and the context takes no task again. False, said once in the log, where there is
    no acl.rt.set_stream_failure_mode (older CANN) or it is refused (the Atlas 200/300/500): a
    batch's streams are then synchronized after its events, which reports their failures, one
    batch at a time (runtime/instance_resources.py)."""
    call = getattr(acl.rt, "set_stream_failure_mode", None)
    ret = None
    if call is not None:
        ret = call(stream, C.ACL_STOP_ON_FAILURE)
        if ret == C.ACL_SUCCESS:
            return True
    _fall_back(acl, "set_stream_failure_mode", ret, "a failed batch shows only in its streams' synchronize, so "
               "each instance runs one batch at a time (one slot: no copy/compute overlap between batches)")
    return False


ABORTED, NO_ABORT, ABORT_FAILED = "aborted", "no abort", "abort failed"  # abort_stream's answers


def abort_stream(acl, stream: int) -> str:
    """Drop what `stream` still runs or holds queued (aclrtStreamAbort). In a context stopped on
    a failure a stream's synchronize returns the failure at once, while the device may still run
    the copies or execution its streams held (hicann/runtime: the synchronize checks the context
    before and while it waits), so a close aborts them before it frees the memory they use.
    ABORTED; ABORT_FAILED (logged): what the stream runs may still run; NO_ABORT, said once,
    where this CANN has no acl.rt.stream_abort or the SoC refuses it (CANN 8.x: the A2/A3 series
    only): the close then relies on destroying the streams, which waits for their tasks."""
    call = getattr(acl.rt, "stream_abort", None)
    ret = None
    if call is not None:
        ret = call(stream)
        if ret == C.ACL_SUCCESS:
            return ABORTED
        if ret != C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
            log.warning("stream_abort failed (%d)", ret)
            return ABORT_FAILED
    _fall_back(acl, "stream_abort", ret, "after a failed batch stops an instance's context, its memory "
               "is freed once its streams are destroyed (which waits for their tasks)")
    return NO_ABORT


def _fall_back(acl, call: str, ret: int | None, consequence: str) -> None:
    """Say once that acl.rt.`call` is missing (`ret` None) or refused with `ret`, and what follows."""
    reason = f"this CANN has no acl.rt.{call}" if ret is None else f"{call} is refused here ({ret})"
    if _first_time(acl, reason):
        log.warning("%s: %s", reason, consequence)
