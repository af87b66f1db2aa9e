"""Context switching that always gives the caller its context back.

The current ACL context is per thread, and every stream, event and model belongs to the context
that was current when it was created or loaded (the device answers 107003 / 107004 when they are
used under another). A helper that needs another context for a moment (a memory query on a
device's management context, building an instance under its own) must not leave the calling
thread switched: these context managers restore what was current before, in a `finally`.
"""
from __future__ import annotations

import contextlib
import logging

from . import constants as C
from .check import check

log = logging.getLogger(__name__)


def current_context(acl) -> int | None:
    """The calling thread's context, or None when it has none (107002)."""
    ctx, ret = acl.rt.get_context()
    if ret == C.ACL_ERROR_RT_CONTEXT_NULL:
        return None
    return check("rt.get_context", (ctx, ret))


def _restore(acl, previous: int | None, left: int | None) -> None:
    if previous is None or previous == left:
        return  # nothing was current (a context cannot be unset), or it is current already
    ret = acl.rt.set_context(previous)
    if ret != C.ACL_SUCCESS:  # the previous context was destroyed meanwhile: nothing to go back to
        log.debug("could not restore context %#x (acl.rt.set_context returned %d)", previous, ret)


@contextlib.contextmanager
def restoring_context(acl):
    """Run the block (which may create or set contexts), then restore the caller's context."""
    previous = current_context(acl)
    try:
        yield previous
    finally:
        _restore(acl, previous, current_context(acl))


@contextlib.contextmanager
def using_context(acl, ctx: int):
    """Make `ctx` current for the block, then restore the caller's context."""
    previous = current_context(acl)
    if previous != ctx:
        check("rt.set_context", acl.rt.set_context(ctx))
    try:
        yield
    finally:
        _restore(acl, previous, ctx)
