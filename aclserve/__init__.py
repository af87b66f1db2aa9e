"""aclserve: a KServe v2 inference server for Ascend .om models, with a CPU runtime."""
import os

from ._version import __version__  # noqa: F401
# what a caller of the Python API catches (README, "the Python API"); errors.py imports nothing
from .errors import Closed, DeviceFailed, DeviceTimeout, ExecutionFailed, LoadError, ServeError  # noqa: F401

# ONNX Runtime (1.29 on) sends telemetry from Linux unless told not to before it loads: a server
# makes no call home, and its warning when it cannot persist a device id (a read-only HOME, as in
# the container) broke --log-format json. ORT_DISABLE_TELEMETRY=0 in the environment keeps it on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__all__ = ["Closed", "DeviceFailed", "DeviceTimeout", "Engine", "ExecutionFailed", "LoadError", "ServeError",
           "__version__"]


def __getattr__(name):
    # `aclserve.Engine` without importing numpy/ACL on a bare `import aclserve`.
    if name == "Engine":
        from .runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'aclserve' has no attribute {name!r}")


def __dir__():
    # (dir(aclserve) lists what __getattr__ gives too: tab completion and help() find Engine)
    return sorted({*globals(), *__all__})
