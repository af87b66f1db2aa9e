"""The one checked call: pyACL returns `ret` last (or alone); turn a non-zero one into AclError.

    dev_ptr = check("rt.malloc", acl.rt.malloc(size, policy))
    free, total = check("rt.get_mem_info", acl.rt.get_mem_info(attr))
    check("rt.set_context", acl.rt.set_context(ctx))
    dataset = check_handle("mdl.create_dataset", acl.mdl.create_dataset())

Nothing else in aclserve inspects a return code.
"""
from __future__ import annotations

from .constants import ACL_SUCCESS, error_meaning


class AclError(RuntimeError):
    """A pyACL call failed: which API, its return code and what the code means."""

    def __init__(self, api: str, ret: int, meaning: str | None = None):
        self.api = api
        self.ret = ret
        self.meaning = meaning if meaning is not None else error_meaning(ret)
        super().__init__(f"acl.{api} failed with {ret}: {self.meaning}")


def check(api: str, result):
    """Split `(values..., ret)` or a bare `ret`; return None, the value, or the tuple of values."""
    if isinstance(result, tuple):
        *values, ret = result
    else:
        values, ret = (), result
    if ret != ACL_SUCCESS:
        raise AclError(api, ret)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def check_handle(api: str, handle: int) -> int:
    """Calls that return a handle or a size directly signal failure with 0."""
    if not handle:
        raise AclError(api, -1, "returned a null handle")
    return handle
