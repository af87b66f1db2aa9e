"""An Engine belongs to the process that created it.

A fork copies the Engine, its models and their pools, but not the pools' launcher and completion
threads nor the ACL state behind them (contexts, streams, device memory): a call in the child was
handed to threads that do not exist there and waited for good. Every call of an Engine or of its
models in another process raises at once instead (a pid compare: cheap on every call).
"""
from __future__ import annotations

import os


class CreatedIn:
    """The process an Engine was created in; check() raises in any other."""

    def __init__(self):
        self.pid = os.getpid()

    def here(self) -> bool:
        return os.getpid() == self.pid

    def check(self) -> None:
        if not self.here():
            raise RuntimeError(f"this Engine was created in process {self.pid}; ACL state does not survive fork: "
                               "create a new Engine in the child (or use the spawn start method)")
