"""Resources with lifetimes on the ACL API: the runtime and devices, loaded models, instances.

The names below load on first use, so a module that needs only the plain data and protocols
(runtime.batch, runtime.types: the scheduler, the server) does not import ACL with them.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "AclRuntime": "acl_runtime", "Batch": "batch", "BatchExecutor": "batch", "BatchListener": "batch",
    "open_pool": "builder", "Device": "device", "LoadError": "device", "Engine": "engine",
    "EngineModel": "engine_model", "ModelInstance": "instance", "OmModel": "om_model", "InstancePool": "pool",
    "DeviceTimings": "types", "TensorSpec": "types", "warm_up": "warmup",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
