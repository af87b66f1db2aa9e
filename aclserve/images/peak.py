"""What decoding one picture holds at its peak, from its header and the plan it is fitted to: the
server charges it to the request before the picture decodes (server/images.py).

Measured (peak RSS over one decode_pixels call, 3000 x 3000 pictures, targets of 224, 1,000 and
3,000 a side, 2026-12-02), in bytes a full-size pixel: a PNG decodes whole, 4.4-10.1 for grey and
RGB ones, 8- or 16-bit, 9.1-12.1 for palette, grey + alpha and RGBA ones (converted through
RGBA); a JPEG decodes at the draft size libjpeg scales it to (1/1 to 1/8 a side: 0.22 a pixel at
1/8, 10.1 at 1/1, with a full-size target), and a progressive one besides holds all its DCT
coefficients, two bytes a sample (6.2 for 4:4:4 YCbCr at 1/8, 8.2 for CMYK, 3.2 for 4:2:0), as
does a sequential one coded in several scans (6.1 for 4:4:4 at 1/8, 6000 x 6000, 2026-12-02).
A PNG's text chunks add what reading them holds at its peak (header.ImageInfo.text_bytes).
"""
from __future__ import annotations

from .decode import draft_scale, jpeg_draft_request
from .header import ImageInfo
from .plan import ImagePlan

PNG_BYTES = 8  # a pixel of a grey or RGB PNG, at most (its decode, conversion and resize)
PNG_ALPHA_BYTES = 13  # a pixel of a palette or alpha PNG (decoded through RGBA; 12.1 measured)
JPEG_DRAFT_BYTES = 8  # a pixel of the size libjpeg decodes a JPEG to
JPEG_FULL_BYTES = 0.25  # a full-size pixel of any JPEG: libjpeg's own buffers, whatever the draft
COEFFICIENT_BYTES = 2  # a full-size sample of a progressive or multi-scan JPEG: its DCT coefficients
TARGET_BYTES = 4  # a pixel of the plan's size: the resized picture and its copies


def decode_peak_bytes(info: ImageInfo, plan: ImagePlan) -> int:
    """Bytes decoding the picture `info` describes for `plan` holds at its peak, at most."""
    pixels = info.width * info.height
    target = plan.width * plan.height * TARGET_BYTES
    if info.format == "PNG":
        return int(pixels * (PNG_ALPHA_BYTES if info.alpha else PNG_BYTES)) + info.text_bytes + target
    scale = 1 if info.lossless else draft_scale(info.width, info.height,
                                                jpeg_draft_request(info.width, info.height, info.orientation, plan))
    drafted = -(-info.width // scale) * -(-info.height // scale)
    coefficients = pixels * info.samples_per_pixel * COEFFICIENT_BYTES if info.buffered else 0
    return int(drafted * JPEG_DRAFT_BYTES + pixels * JPEG_FULL_BYTES + coefficients) + target
