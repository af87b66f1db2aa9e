"""One loaded model version: its InstancePool and its DynamicBatcher, with a lifecycle state.

Owned by the ModelRepository. `infer` delegates to the batcher. When the version is retired
(replaced or unloaded), its batcher drains: it takes no new requests, and finishes the queued
and in-flight ones; a request that raced the swap and is refused by the draining batcher is
re-sent once to the successor (the same version reloaded, else the model's newest version), so
a reload never fails a request (also when the caller held this object past the close of its
batcher, e.g. while reading a request body). close_pool() is blocking: the repository runs it
in an executor after the drain.
"""
from __future__ import annotations

import logging
from typing import Callable

from ..config import ModelConfig
from ..errors import ModelUnavailable, ShuttingDown

log = logging.getLogger(__name__)

LOADING, READY, UNAVAILABLE, UNLOADING = "LOADING", "READY", "UNAVAILABLE", "UNLOADING"
PLATFORM = "ascend_om"


class ServedVersion:
    def __init__(self, name: str, version: str, pool, batcher, config: ModelConfig, source: str,
                 om_path: str, load_seconds: float = 0.0, wanted=None, images=None, labels=None):
        self.name = name
        self.version = version
        self.pool = pool
        self.batcher = batcher
        self.config = config
        self.source = source  # the file in the repository (.om or .onnx)
        self.om_path = om_path  # what was loaded (the compiled cache file for an .onnx)
        self.load_seconds = load_seconds
        self.wanted = wanted  # the plan.Wanted (file identity + config) this version came from
        self.images = images  # images.ImageStage for its image inputs, or None
        self.labels = labels or {}  # output name -> class labels
        self.platform = PLATFORM
        self.state = READY
        self._successor: Callable[[], "ServedVersion | None"] | None = None

    # what the server reads
    @property
    def inputs(self):
        """As clients see them: image inputs are BYTES (self.pool.inputs has the model's own)."""
        return self.images.client_inputs(self.pool.inputs) if self.images else self.pool.inputs

    @property
    def outputs(self):
        return self.pool.outputs

    @property
    def max_batch_size(self) -> int:
        """The protocol's max_batch_size: the batcher's batch_limit (the largest compiled gear,
        or the configured cap when lower); 0 for a static model."""
        return self.batcher.batch_limit

    @property
    def gears(self) -> tuple[int, ...]:
        return tuple(self.pool.gears)

    @property
    def stats(self):
        return self.batcher.stats

    async def infer(self, inputs, rows: int, priority: int | None = None, timeout_us: int | None = None,
                    trace=None):
        try:
            return await self.batcher.infer(inputs, rows, priority=priority, timeout_us=timeout_us, trace=trace)
        except (ModelUnavailable, ShuttingDown):
            # refused because this version was retired after the caller looked it up (draining,
            # or already closed): hand the request to the version that took over
            successor = self._successor() if self._successor is not None else None
            if successor is None or successor is self:
                raise
            return await successor.batcher.infer(inputs, rows, priority=priority, timeout_us=timeout_us,
                                                 trace=trace)

    def retire(self, successor: Callable[[], "ServedVersion | None"]) -> None:
        """Mark as leaving service; `successor()` names where raced requests go."""
        self.state = UNLOADING
        self._successor = successor

    async def drain(self, timeout_s: float) -> None:
        await self.batcher.drain(timeout_s)

    async def close_batcher(self) -> None:
        await self.batcher.close()

    def close_pool(self) -> None:
        """Blocking: frees every device resource of this version. Safe twice."""
        self.pool.close()
        self.state = UNAVAILABLE

    def __repr__(self) -> str:
        return f"<ServedVersion {self.name}:{self.version} {self.state}>"
