"""The chip's DVPP limits, by SoC, as CANN's JPEGD and VPC constraints state them (media.py checks
them). Stated here on their own although images/dvpp.py states them for the host side too: the
emulation must not take them from the code it checks. Which family a SoC belongs to is asked of
soc_families.py, as the host side asks it: the two cannot sort a name differently."""
from __future__ import annotations

from ...soc_families import SocFamily, soc_family

PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1  # acldvppPixelFormat: NV12
JPEGD_SIDES = (32, 8192)
JPEGD_HEIGHT_ALIGN = 16
VPC_INPUT = ((10, 8192), (6, 8192))  # (width range, height range)
VPC_OUTPUT = ((10, 4096), (6, 4096))  # the Ascend310, 310P and training series': vpc_output() gives each SoC's
VPC_WIDTH_ALIGN, VPC_HEIGHT_ALIGN = 16, 2
VPC_MIN_WIDTH_STRIDE = 32  # CANN's VPC constraints: "宽Stride最小32" (a 16 was taken here)
VPC_SCALE = (1 / 32, 16)


# the families whose JPEGD aligns a width stride to 64, and whose VPC outputs up to 8192 rows
JPEGD_ALIGN_64 = (SocFamily.ATLAS_INFERENCE, SocFamily.ATLAS_200I_500_A2, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)
VPC_TALL_OUTPUT = (SocFamily.ATLAS_200I_500_A2, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)


def jpegd_width_align(soc: str) -> int:
    """JPEGD's output width stride alignment (CANN's JPEGD constraints): 64 on the Ascend310P,
    310B, and the A2 and A3 (910B1.., 910_93..), 128 on the Ascend310, the training series (910,
    910A/B, 910ProA/B, 910PremiumA) and anything else."""
    return 64 if soc_family(soc) in JPEGD_ALIGN_64 else 128


def vpc_output(soc: str):
    """VPC's output (width range, height range) (CANN's VPC constraints): 4096 x 8192 at most on the
    Ascend310B and the A2 and A3, 4096 x 4096 on the Ascend310P, 310, training series and anything else."""
    return ((10, 4096), (6, 8192)) if soc_family(soc) in VPC_TALL_OUTPUT else VPC_OUTPUT
