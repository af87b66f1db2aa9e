"""Plain data shared by the runtime, the batcher and the server (no ACL handles here)."""
from __future__ import annotations

from dataclasses import dataclass

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
    # an input behind static AIPP: the pixels its AIPP takes (rgb, bgr: RGB888 with R and B
    # swapped, gray: YUV400), as acl.mdl.get_first_aipp_info reports it; None otherwise
    aipp_color: str | None = None
    # an input behind static AIPP of another format (YUV420SP_U8, ...): its name. The input is its
    # raw buffer, as get_input_dims_v2 lays it out (YUV420SP: [N, 1.5H, W, 1] uint8); images cannot feed it
    raw_aipp_format: str | None = None
    # a config.pbtxt's reshape: the model's shape of a row (of the whole tensor, for a static model)
    # where `shape` is the one clients use (repository/declared.py); None otherwise
    reshape: tuple[int, ...] | None = None

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
