"""aclserve: a KServe v2 inference server for Ascend .om models, with a CPU runtime."""
__version__ = "0.1.0"


def __getattr__(name):
    # `aclserve.Engine` without importing numpy/ACL on a bare `import aclserve`.
    if name == "Engine":
        from .runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'aclserve' has no attribute {name!r}")
