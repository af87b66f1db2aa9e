"""What decoding one picture holds at its peak, from its header and the plan it is fitted to: the
server charges it to the request before the picture decodes (server/images.py).

Measured (peak RSS over one decode_pixels call, 3000 x 3000 pictures, targets of 224, 1,000 and
3,000 a side, 2026-12-02), in bytes a full-size pixel: a PNG decodes whole, 4.4-10.1 for grey and
RGB ones, 8- or 16-bit, 9.1-12.1 for palette, grey + alpha and RGBA ones (converted through
RGBA); a JPEG decodes at the draft size libjpeg scales it to (1/1 to 1/8 a side: 0.22 a pixel at
1/8, 10.1 at 1/1, with a full-size target), and a progressive one besides holds all its DCT
coefficients, two bytes a sample (6.2 for 4:4:4 YCbCr at 1/8, 8.2 for CMYK, 3.2 for 4:2:0), as
does a sequential one coded in several scans (6.1 for 4:4:4 at 1/8, 6000 x 6000, 2026-12-02).
A PNG's text chunks add what they cost its decode (png_text.text_bytes: header.ImageInfo.text_bytes),
a picture the decode may turn (ImageInfo.may_turn) the copy of it the turn makes (TURN_BYTES), and
what Pillow holds of the metadata it reads (JPEG APPn and COM segments, PNG chunks: metadata_cost.py,
ImageInfo.metadata_bytes).
"""
from __future__ import annotations

import numpy as np

from .decode import draft_scale, jpeg_draft_request
from .header import ImageInfo
from .plan import ImagePlan

PNG_BYTES = 8  # a pixel of a grey or RGB PNG, at most (its decode, conversion and resize)
PNG_ALPHA_BYTES = 13  # a pixel of a palette or alpha PNG (decoded through RGBA; 12.1 measured)
JPEG_DRAFT_BYTES = 8  # a pixel of the size libjpeg decodes a JPEG to
JPEG_FULL_BYTES = 0.25  # a full-size pixel of any JPEG: libjpeg's own buffers, whatever the draft
COEFFICIENT_BYTES = 2  # a full-size sample of a progressive or multi-scan JPEG: its DCT coefficients
# A pixel of a picture the decode turns or flips (its EXIF orientation): the copy Image.transpose
# makes of it as decoded (4 bytes in Pillow's RGB, RGBA and LA, 2 in 16-bit grey, 1 in L and P),
# held beside it. The bytes a pixel above were measured upright: a 3000 x 3000 RGB PNG turned
# peaked at 68.9-69.3 MiB where 68.7 were charged (8 bytes a pixel: the picture and its copy,
# nothing left for the rest; found by an independent tester)
TURN_BYTES = 4
# A pixel of the plan's size, besides the row a decode writes (measured, 1 x 1 PNGs to 2048 x 2048,
# 2026-12-05): Pillow's resized picture (4 bytes a pixel in RGB, 1 in grey) and the two copies of
# its samples numpy's asarray makes of it (tobytes' chunks, then their join): 9.9 RGB, 2.9 grey;
# DVPP's host side holds less (its NV12 copied back and nv12_to_pixels: 4.7 RGB, 1.5 grey, traced
# 2026-12-05; its float32 conversion held 49.5 RGB: test_images_dvpp checks the charge covers it)
RESIZED_BYTES = {3: 10, 1: 3}
# then, those freed, a byte a sample for the pixels, one more for an inverted copy, one more for a
# letterbox's padded one, and 4 for the float32 picture a float16 row is normalised in (15.0 for
# RGB float16: a float32 row is normalised where it lies)
FLOAT_WORK_BYTES = 4


def decode_peak_bytes(info: ImageInfo, plan: ImagePlan) -> int:
    """Bytes decoding the picture `info` describes for `plan` holds at its peak, at most."""
    pixels = info.width * info.height
    besides = plan.width * plan.height * target_pixel_bytes(plan) + info.metadata_bytes  # fitted; metadata
    turn = TURN_BYTES if info.may_turn else 0
    if info.format == "PNG":
        return int(pixels * ((PNG_ALPHA_BYTES if info.alpha else PNG_BYTES) + turn)) + info.text_bytes + besides
    scale = 1 if info.lossless else draft_scale(info.width, info.height,
                                                jpeg_draft_request(info.width, info.height, info.orientation, plan))
    drafted = -(-info.width // scale) * -(-info.height // scale)
    coefficients = pixels * info.samples_per_pixel * COEFFICIENT_BYTES if info.buffered else 0
    return int(drafted * (JPEG_DRAFT_BYTES + turn) + pixels * JPEG_FULL_BYTES + coefficients) + besides


def target_pixel_bytes(plan: ImagePlan) -> int:
    """Bytes a decode for `plan` holds a pixel of the plan's size at most, besides its row of
    the request's input tensor (charged with the tensor: ImageStage.tensor_bytes)."""
    copies = 1 + (plan.invert is not False) + (plan.resize == "letterbox")
    work = FLOAT_WORK_BYTES if plan.dtype.kind == "f" and plan.dtype != np.float32 else 0
    return max(RESIZED_BYTES[plan.channels], plan.channels * (copies + work))
