"""aclserve: a KServe v2 inference server for Ascend .om models, with a CPU runtime."""
from ._version import __version__  # noqa: F401


def __getattr__(name):
    # `aclserve.Engine` without importing numpy/ACL on a bare `import aclserve`.
    if name == "Engine":
        from .runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'aclserve' has no attribute {name!r}")
