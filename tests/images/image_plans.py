"""Plans for the image tests: an image input's TensorSpec, a plan built over one, and the decode
limits (pixels, side) the CPU decoder is given."""
from __future__ import annotations

import numpy as np

from aclserve.config import ImageInput
from aclserve.images import build_plan
from aclserve.runtime.types import TensorSpec

LIMITS = (40_000_000, 16384)


def spec(shape, datatype="UINT8", fmt="NHWC"):
    dtype = {"UINT8": np.uint8, "FP32": np.float32, "FP16": np.float16, "INT32": np.int32}[datatype]
    return TensorSpec("x", datatype, np.dtype(dtype), tuple(shape), fmt)


def plan(h=8, w=8, c=3, **kw):
    return build_plan(ImageInput(**kw), spec((-1, h, w, c)))
