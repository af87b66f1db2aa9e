"""The pyACL boundary: pick the real `acl` module (CANN) or the CPU runtime.

ACLSERVE_DEVICE=auto (default) uses the real module when `import acl` works and it sees at
least one device; npu insists on it; cpu always uses `aclserve.acl.cpu`, which has pyACL's
names, argument order, return tuples and error codes. Nothing outside aclserve/acl,
aclserve/runtime and the DVPP decoder (images/dvpp.py, handed the runtime's) touches the module
itself (.importlinter's `acl` contract lists every other import of this package).
"""
from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

from .check import AclError, check, check_handle, release  # noqa: F401  (re-exported)
from .context import current_context, restoring_context, using_context  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "npu", "cpu")
_selected: tuple[str, ModuleType] | None = None


DEVICE_ENV = "ACLSERVE_DEVICE"
_NO_CANN = "CANN's `acl` module is not importable or sees no device"


class AclUnavailable(RuntimeError):
    """npu was asked for but CANN's acl module or a device is missing (or the other runtime is in
    use). `by_setting`: the device setting asked for it, not ACLSERVE_DEVICE; its owner knows
    where that came from (a flag, a file) and says so: npu_missing."""

    def __init__(self, message: str, by_setting: bool = False):
        super().__init__(message)
        self.by_setting = by_setting


def npu_missing(asker: str, by_setting: bool) -> AclUnavailable:
    """The refusal of an npu `asker` asked for (`device: npu in f.yaml`, `--device npu`, ACLSERVE_DEVICE=npu)."""
    return AclUnavailable(f"device npu asked for by {asker} but {_NO_CANN}", by_setting)


def _real_acl() -> ModuleType | None:
    try:
        real = importlib.import_module("acl")
    except ImportError:
        return None
    try:
        count, ret = real.rt.get_device_count()
    except Exception:  # a broken CANN install: treat as absent
        log.exception("the acl module imported but get_device_count failed")
        return None
    return real if ret == 0 and count > 0 else None


def select(device: str | None = None) -> tuple[str, ModuleType]:
    """Return ("npu"|"cpu", module). The first choice sticks for the process. `device` npu or cpu
    (the config's, or the CLI's) wins; auto or None defers to ACLSERVE_DEVICE."""
    global _selected
    by_setting = device is not None and device.lower() != "auto"
    if by_setting:
        choice = device.lower()
    else:
        choice = (os.environ.get(DEVICE_ENV) or "auto").strip().lower() or "auto"
    if choice not in DEVICE_CHOICES:
        raise ValueError(f"{DEVICE_ENV} must be one of {', '.join(DEVICE_CHOICES)}, not {choice!r}")
    if _selected is not None:
        kind = _selected[0]
        if choice != "auto" and choice != kind:
            raise AclUnavailable(f"the {kind} runtime is already in use in this process; cannot switch to {choice}")
        return _selected
    if choice in ("auto", "npu"):
        real = _real_acl()
        if real is not None:
            _selected = ("npu", real)
            return _selected
        if choice == "npu":  # (the device setting's origin: the owner's to say, cli/serve.py)
            raise npu_missing("the device setting" if by_setting else f"{DEVICE_ENV}=npu (the device setting "
                              "being auto)", by_setting)
    from . import cpu

    _selected = ("cpu", cpu)
    return _selected


def device_soc_name() -> str | None:
    """The SoC of this machine's NPU as CANN names it (e.g. "Ascend310P3"); None without CANN or
    a device. Initialises and finalises ACL: for tools like `aclserve compile`, not a server."""
    real = _real_acl()
    if real is None:
        return None
    from . import compat

    ret = real.init()
    try:
        return compat.soc_name(real)
    finally:
        if ret == 0:
            release("finalize", real.finalize())
