"""Plain data shared by the runtime, the batcher and the server (no ACL handles here)."""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as a client sees it.

    `shape` has -1 in the batch dimension of a dynamic-batch model; `bytes_per_sample` is the
    size of one batch row (the whole tensor for a static model).
    """

    name: str
    datatype: str  # KServe v2 name, e.g. "FP32"
    dtype: np.dtype
    shape: tuple[int, ...]
    format: str = "ND"
    bytes_per_sample: int = 0

    @property
    def batched(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == -1

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.batched else self.shape


@dataclass
class DeviceTimings:
    """Device-side time of one batch, from event_elapsed_time (milliseconds)."""

    h2d_ms: float = 0.0
    compute_ms: float = 0.0
    d2h_ms: float = 0.0


@dataclass
class BatchResult:
    """What a batch run returns: outputs per request (submit order, padding rows dropped)."""

    outputs: list[dict[str, np.ndarray]]
    gear: int | None  # compiled batch size that ran; None for a static model
    rows: int  # real rows (sum of request batch sizes)
    timings: DeviceTimings = field(default_factory=DeviceTimings)
    instance: str = ""


class BatchExecutor(Protocol):
    """What the batcher needs from a model version's instances (runtime.InstancePool)."""

    gears: tuple[int, ...]  # ascending; () for a static model (one request per run)
    gear_cost: dict[int, float]  # seconds per lone run of each gear, submit to result (warm-up)
    compute_cost: dict[int, float]  # seconds of device compute per gear (warm-up; may be empty)

    def lanes(self) -> list[int]:
        """Per instance ("lane", by index), the slots that can take a batch now (0 when it
        takes none: busy, resetting after a fault, broken)."""

    def add_slot_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (from any thread) whenever a slot becomes free."""

    def submit(self, requests: Sequence[Mapping[str, np.ndarray]], gear: int | None, trace=None,
               lane: int | None = None) -> concurrent.futures.Future:
        """Run one batch; never blocks. Each request maps every input name to an array whose
        first dimension is that request's row count (rows sum <= gear). With `lane`, the batch
        runs on that instance (waiting for one of its slots if needed) unless it is broken.
        The future resolves to a BatchResult, or raises errors.ExecutionFailed naming what
        went wrong. `trace` (a trace.BatchTrace, or None) is filled with the batch's host and
        device times."""
