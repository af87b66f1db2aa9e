"""Resources with lifetimes on the ACL API: the runtime and devices, loaded models, instances."""
from .acl_runtime import AclRuntime
from .batch import Batch, BatchExecutor, BatchListener
from .builder import open_pool
from .device import Device, LoadError
from .engine import Engine, EngineModel
from .instance import ModelInstance
from .om_model import OmModel
from .pool import InstancePool
from .types import DeviceTimings, TensorSpec

__all__ = ["AclRuntime", "Batch", "BatchExecutor", "BatchListener", "Device", "LoadError", "Engine",
           "EngineModel", "ModelInstance", "OmModel", "InstancePool", "open_pool", "DeviceTimings", "TensorSpec"]
