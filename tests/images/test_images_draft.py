"""A JPEG scaled by libjpeg while it decodes (Pillow's Image.draft: 1/2, 1/4 or 1/8 a side) and
then resized: against Pillow's full decode and the same resize, its geometry kept, its filter
left room to smooth, and none for `nearest`."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from aclserve.config import ImageInput
from aclserve.images import build_plan
from aclserve.images.decode import decode_pixels, fit_box
from aclserve.runtime.types import TensorSpec
from .images_data import encode, gradient

LIMITS = (40_000_000, 16384)
FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "area": Image.BOX}


def plan(h=8, w=8, c=3, **kw):
    return build_plan(ImageInput(**kw), TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, h, w, c), "NHWC"))


def full_decode(data: bytes, image_plan, mode: str = "RGB") -> np.ndarray:
    """Pillow's full decode, turned upright, resized as the plan says: what a training pipeline sees."""
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(mode)
    size, box = fit_box(im.width, im.height, image_plan)
    return np.asarray(im.resize(size, FILTERS[image_plan.interpolation], box=box)).reshape(size[1], size[0], -1)


@pytest.mark.parametrize("resize", ["stretch", "center_crop", "letterbox"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_jpeg_scaled_while_decoding_keeps_its_geometry(orientation, resize):
    """libjpeg rounds a scaled size up: 201 x 153 (sides of 8k + 1) at 1/4 is 51 x 39 pixels, of
    which 50.25 x 38.25 are the picture, the rest its edge repeated. Resized whole, the picture
    was stretched (here 2.3-14 levels from a full decode on average; an independent tester:
    105 x 105 digits to 8 x 8, 85.6 % read right instead of 96.4 %); the turn that flips an axis
    moves the repeated edge to its start."""
    yy, xx = np.mgrid[0:153, 0:201]
    zigzag = lambda t, period: np.abs((t / period) % 2 - 1) * 255  # noqa: E731 (steep but smooth)
    im = Image.fromarray(np.stack([zigzag(xx, 64), zigzag(yy, 48), zigzag(xx + yy, 96)], -1).round().astype(np.uint8))
    exif = im.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    data = buf.getvalue()
    fitted = plan(16, 24, resize=resize, crop_fraction=0.875)  # bilinear: 201 x 153 decodes at 1/4
    got = decode_pixels(data, fitted, *LIMITS).astype(int)
    assert np.abs(got - full_decode(data, fitted)).mean() < 2  # (0.3-1.5)


def test_jpeg_downscaled_while_decoding_matches_full_decode_closely():
    pic = gradient(512, 512)
    data = encode(pic, "JPEG", quality=95)
    fast = decode_pixels(data, plan(64, 64), *LIMITS).astype(int)  # libjpeg scales by 1/4 here
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64), Image.BILINEAR)).astype(int)
    assert np.abs(fast - full).mean() < 3


def test_jpeg_scaling_leaves_the_resize_room_to_filter():
    """Asked for the target's size, libjpeg decoded a JPEG just over 2^k times the target to
    about that size, and the resize hardly filtered (an independent tester: 7-pixel diagonal
    stripes, text-like, 400 x 300 to 32 x 32 grey: mean 16.75, max 88 levels from a full decode
    and the same resize; a photo of 513 x 513 to 64 x 64: 7.6, 111)."""
    stripes = ((np.indices((300, 400)).sum(0) // 7 % 2) * 255).astype(np.uint8)
    data = encode(np.stack([stripes] * 3, -1), "JPEG", quality=95)
    fast = decode_pixels(data, plan(32, 32, 1, color="gray", interpolation="area"), *LIMITS)[:, :, 0].astype(int)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("L").resize((32, 32), Image.BOX)).astype(int)
    assert np.abs(fast - full).mean() < 8  # (5.7, max 25)
    fine = ((np.indices((129, 129)).sum(0) // 3 % 2) * 255).astype(np.uint8)  # just over twice 64
    data = encode(np.stack([fine] * 3, -1), "JPEG", quality=95)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64), Image.BILINEAR))
    assert (decode_pixels(data, plan(64, 64), *LIMITS) == full).all()  # decoded whole (was mean 46)


@pytest.mark.parametrize("orientation", [1, 6])
def test_nearest_decodes_a_jpeg_whole(orientation):
    """nearest takes one source pixel where libjpeg's scaling gives each the mean of 8 x 8 (at
    1/8): scaled, 640 and 1280 pixel photos to 64 came out 12-14 levels from a full decode (an
    independent tester). Decoded whole, they are the same pixels."""
    im = Image.fromarray(gradient(640, 1280))
    exif = im.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    data = buf.getvalue()
    for fitted in (plan(64, 64, interpolation="nearest"), plan(48, 64, resize="letterbox", interpolation="nearest")):
        assert (decode_pixels(data, fitted, *LIMITS) == full_decode(data, fitted)).all()
