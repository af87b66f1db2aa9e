"""The chip's DVPP limits, by SoC, as CANN's JPEGD and VPC constraints state them (media.py checks
them). Stated here on their own although images/dvpp.py states them for the host side too: the
emulation must not take them from the code it checks."""
from __future__ import annotations

PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1  # acldvppPixelFormat: NV12
JPEGD_SIDES = (32, 8192)
JPEGD_HEIGHT_ALIGN = 16
VPC_INPUT = ((10, 8192), (6, 8192))  # (width range, height range)
VPC_OUTPUT = ((10, 4096), (6, 4096))  # the Ascend310, 310P and first 910's: vpc_output() gives each SoC's
VPC_WIDTH_ALIGN, VPC_HEIGHT_ALIGN = 16, 2
VPC_MIN_WIDTH_STRIDE = 32  # CANN's VPC constraints: "宽Stride最小32" (a 16 was taken here)
VPC_SCALE = (1 / 32, 16)


def jpegd_width_align(soc: str) -> int:
    """JPEGD's output width stride alignment (CANN's JPEGD constraints): 64 on the Ascend310P,
    310B, 910B and later, 128 on the Ascend310, the first Ascend910 and anything else."""
    return 64 if soc.lower().startswith(("ascend310p", "ascend310b", "ascend910b", "ascend910_93")) else 128


def vpc_output(soc: str):
    """VPC's output (width range, height range) (CANN's VPC constraints): 4096 x 8192 at most on the
    Ascend310B, 910B and later, 4096 x 4096 on the Ascend310P, 310, first Ascend910 and anything else."""
    if soc.lower().startswith(("ascend310b", "ascend910b", "ascend910_93")):
        return (10, 4096), (6, 8192)
    return VPC_OUTPUT
