"""The one checked call: pyACL returns `ret` last (or alone); turn a non-zero one into AclError.

    dev_ptr = check("rt.malloc", acl.rt.malloc(size, policy))
    free, total = check("rt.get_mem_info", acl.rt.get_mem_info(attr))
    check("rt.set_context", acl.rt.set_context(ctx))
    dataset = check_handle("mdl.create_dataset", acl.mdl.create_dataset())
    release("rt.destroy_stream", acl.rt.destroy_stream(stream))   # teardown: log, carry on

Every other pyACL call in aclserve goes through these, except the probes whose failure is an
answer rather than an error, which read the code themselves: whether CANN sees a device
(acl/__init__.py), whether the thread has a context and whether an old one can be restored
(acl/context.py).
"""
from __future__ import annotations

import logging

from .constants import ACL_ERROR_GE_EXEC_MODEL_ID_INVALID, ACL_SUCCESS, error_meaning

log = logging.getLogger(__name__)


# the most of what the device said that an error's message shows (it ends in a load failure's one-line reason)
SAID_CHARS = 600
# what comes before the device's words in an error's message (a load failure's label takes their ids out after it)
DEVICE_SAYS = "; the device says: "


class AclError(RuntimeError):
    """A pyACL call failed: which API, its return code and what the code means, and what the
    device said of it (acl.get_recent_err_msg, where the caller asked: compat.told), if anything:
    `said` whole (a load's retries compare it: repository/retry.py), its message SAID_CHARS of it."""

    def __init__(self, api: str, ret: int, meaning: str | None = None, said: str | None = None):
        self.api = api
        self.ret = ret
        self.meaning = meaning if meaning is not None else error_meaning(ret)
        self.said = said
        shown = said[:SAID_CHARS - 4] + " ..." if said and len(said) > SAID_CHARS else said
        told = f"{DEVICE_SAYS}{shown}" if said else ""
        super().__init__(f"acl.{api} failed with {ret}: {self.meaning}{told}")

    def told(self, said: str | None) -> "AclError":
        """This error with what the device said of it (itself when it said nothing)."""
        return self if not said else AclError(self.api, self.ret, self.meaning, said)


def model_refused(error: BaseException | None) -> bool:
    """Whether `error`, or what it was raised from (a batch's ExecutionFailed holds the ACL call's
    error), is GE refusing a model's run for what it was given (145xxx: its buffers, its gear, an
    OM whose header its graph does not compute: the CPU runtime's _ort_failures.py). The same run
    is refused the same way: no device fault, and no warm-up data to blame. Not 145003, an unknown
    model id, which a run meets when its model is unloaded under it."""
    for _ in range(4):
        if error is None:
            return False
        if isinstance(error, AclError):
            return error.ret // 1000 == 145 and error.ret != ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        error = error.__cause__
    return False


def check(api: str, result, also_ok: tuple[int, ...] = ()):
    """Split `(values..., ret)` or a bare `ret`; return None, the value, or the tuple of values.
    `also_ok`: codes that mean success for this call (e.g. a repeated initialize)."""
    if isinstance(result, tuple):
        *values, ret = result
    else:
        values, ret = (), result
    if ret != ACL_SUCCESS and ret not in also_ok:
        raise AclError(api, ret)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def check_handle(api: str, handle: int) -> int:
    """Calls that return a handle or a size directly signal failure with 0."""
    if not handle:
        raise AclError(api, -1, "returned a null handle")
    return handle


def release(api: str, result) -> bool:
    """Teardown: a failed destroy/free is logged and the caller goes on releasing the rest
    (raising would leak everything after it). True when the call succeeded."""
    try:
        check(api, result)
    except AclError as e:
        log.warning("%s (teardown continues)", e)
        return False
    return True
