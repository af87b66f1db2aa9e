"""What an InstancePool needs to replace an instance out of rotation (builder.InstanceBuilder has it)."""
from __future__ import annotations

from typing import Protocol

from .instance import ModelInstance


class Rebuilder(Protocol):
    """How the pool replaces an instance out of rotation (builder.InstanceBuilder)."""

    def build(self, lane: int, execution_timeout_ms: int) -> ModelInstance:
        """A fresh instance for `lane` (blocking). DeviceFailed on a device that failed as a whole:
        the pool then gives that lane up."""

    def dispose(self, instance: ModelInstance) -> None:
        """Close an instance the pool no longer uses (blocks until the device lets go of it,
        at most its reset_timeout_ms)."""
