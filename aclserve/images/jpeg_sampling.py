"""How a JPEG's components are sampled, read from its frame header's sampling factors (one byte a
component: horizontal factor in the high nibble, vertical in the low): the samples a decoded
pixel holds (peak.py's charge) and the subsampling's name, which says whether a chip's JPEG
decoder takes the picture (dvpp.py). Pure functions over the factor bytes.
"""
from __future__ import annotations

# the luma's factors, both chroma components sampled 1x1, by the name they are known by
_LUMA_FACTORS = {0x11: "4:4:4", 0x21: "4:2:2", 0x22: "4:2:0", 0x12: "4:4:0", 0x41: "4:1:1"}
GREY = "4:0:0"


def samples_per_pixel(sampling: bytes) -> float:
    """Each component's samples over a full-size pixel, added up: its sampling factors over the
    largest ones (4:2:0 YCbCr: 1 + 0.25 + 0.25)."""
    if not sampling:
        return 1.0
    h = [b >> 4 or 1 for b in sampling]  # (a factor of 0 is refused by the decode, with its 400)
    v = [b & 15 or 1 for b in sampling]
    return sum(hi * vi for hi, vi in zip(h, v)) / (max(h) * max(v))


def subsampling(sampling: bytes) -> str:
    """The subsampling's name: "4:0:0" for one component (its factors do not matter: a lone
    component is never subsampled); for three, "4:4:4", "4:2:2", "4:2:0", "4:4:0" or "4:1:1"
    when the chroma is 1x1 and the luma 1x1, 2x1, 2x2, 1x2 or 4x1; else the factors themselves
    ("2x2,2x1,1x1"), as encoders write rarely (a 4:4:4 spelt 2x2 throughout included)."""
    if len(sampling) == 1:
        return GREY
    if len(sampling) == 3 and sampling[1] == sampling[2] == 0x11 and sampling[0] in _LUMA_FACTORS:
        return _LUMA_FACTORS[sampling[0]]
    return ",".join(f"{b >> 4}x{b & 15}" for b in sampling)
