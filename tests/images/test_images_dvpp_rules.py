"""The DVPP path's rules, without a device: its NV12 colour conversion, VPC's output and JPEGD's
width stride by SoC, which pictures and plans DVPP is given and what rules a plan out of it."""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.config import ImageInput
from aclserve.images import build_plan
from aclserve.images.dvpp import dvpp_takes, jpegd_width_align, nv12_to_pixels, plan_refusals, vpc_output
from aclserve.images.header import ImageInfo

from .image_plans import plan, spec


def test_nv12_conversion_inverts_jpeg_colour_transform():
    rng = np.random.default_rng(1)
    rgb = np.repeat(np.repeat(rng.integers(40, 215, (4, 8, 3)), 2, 0), 2, 1).astype(np.float64)  # 2x2 blocks
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    u = -0.168736 * r - 0.331264 * g + 0.5 * b + 128
    v = 0.5 * r - 0.418688 * g - 0.081312 * b + 128
    stride_w, stride_h = 32, 8  # padded, as VPC writes it
    nv12 = np.zeros(stride_w * stride_h * 3 // 2, np.uint8)
    nv12[:stride_w * stride_h].reshape(stride_h, stride_w)[:8, :16] = np.rint(y)
    uv = nv12[stride_w * stride_h:].reshape(stride_h // 2, stride_w // 2, 2)
    uv[:4, :8, 0], uv[:4, :8, 1] = np.rint(u[::2, ::2]), np.rint(v[::2, ::2])
    out = nv12_to_pixels(nv12, stride_w, stride_h, plan(8, 16))
    assert out.shape == (8, 16, 3) and np.abs(out.astype(int) - rgb).max() <= 2
    grey = nv12_to_pixels(nv12, stride_w, stride_h, plan(8, 16, 1))
    np.testing.assert_array_equal(grey[:, :, 0], np.rint(y).astype(np.uint8))


def test_vpc_output_follows_the_soc():
    """CANN's VPC constraints: output up to 4096 x 4096 on the Ascend310P, 310 and training series
    (the Ascend910B among them: its name's beginning took it for an A2), and an unknown SoC,
    4096 x 8192 on the 310B, A2 (910B1..B4) and A3; a taller target decodes on the CPU."""
    info, tall = ImageInfo("JPEG", 640, 480, baseline=True), build_plan(ImageInput(), spec((-1, 4224, 224, 3)))
    for soc in ("Ascend310P3", "Ascend310", "Ascend910A", "Ascend910B", "Ascend910ProB", None, "CPU-ORT"):
        assert vpc_output(soc) == ((10, 4096), (6, 4096)), soc
        assert not dvpp_takes(info, tall, vpc_output(soc)), soc
    for soc in ("Ascend310B1", "Ascend910B1", "Ascend910B2", "Ascend910B4", "Ascend910_9391"):
        assert vpc_output(soc) == ((10, 4096), (6, 8192)), soc
        assert dvpp_takes(info, tall, vpc_output(soc)), soc
    assert not dvpp_takes(info, tall)  # without the SoC's: the narrowest


def test_jpegd_width_stride_follows_the_soc():
    """pyACL's JPEGD constraints: 128 on the Ascend310 and the training series (the Ascend910B
    among them, not an A2), 64 on the 310P, 310B, A2 (910B1..B4) and A3."""
    for soc in ("Ascend310", "Ascend910A", "Ascend910B", "Ascend910ProB", None, "SomethingNew"):
        assert jpegd_width_align(soc) == 128, soc
    for soc in ("Ascend310P3", "Ascend310B1", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4",
                "Ascend910_9391"):
        assert jpegd_width_align(soc) == 64, soc


@pytest.mark.parametrize("info, size, resize, takes", [
    (ImageInfo("JPEG", 640, 480, baseline=True), (224, 224), "stretch", True),
    (ImageInfo("JPEG", 640, 480, baseline=False), (224, 224), "stretch", False),  # progressive
    (ImageInfo("JPEG", 640, 480, baseline=True, orientation=6), (224, 224), "stretch", False),
    (ImageInfo("JPEG", 640, 480, baseline=True, ycc=False), (224, 224), "stretch", False),  # RGB, CMYK
    (ImageInfo("JPEG", 640, 480, baseline=True, subsampling="4:1:1"), (224, 224), "stretch", False),  # JPEGD's 148052
    (ImageInfo("JPEG", 640, 480, baseline=True, subsampling="2x2,2x2,2x2"), (224, 224), "stretch", False),
    (ImageInfo("JPEG", 640, 480, baseline=True, subsampling="4:4:0"), (224, 224), "stretch", True),
    (ImageInfo("JPEG", 640, 480, baseline=True, subsampling="4:0:0"), (224, 224), "stretch", True),  # grey
    (ImageInfo("PNG", 640, 480), (224, 224), "stretch", False),
    (ImageInfo("JPEG", 640, 480, baseline=True), (224, 224), "letterbox", False),
    (ImageInfo("JPEG", 640, 480, baseline=True), (223, 224), "stretch", False),  # odd target
    (ImageInfo("JPEG", 641, 480, baseline=True), (224, 224), "stretch", False),  # odd image
    (ImageInfo("JPEG", 16, 480, baseline=True), (16, 224), "stretch", False),  # under JPEGD's 32
    (ImageInfo("JPEG", 9000, 480, baseline=True), (224, 224), "stretch", False),  # over 8,192
    (ImageInfo("JPEG", 8000, 480, baseline=True), (224, 224), "stretch", False),  # 1/35: under VPC's 1/32
    (ImageInfo("JPEG", 40, 40, baseline=True), (700, 700), "stretch", False),  # 17.5x: over VPC's 16
    (ImageInfo("JPEG", 64, 64, baseline=True), (8, 8), "stretch", False),  # under VPC's output 10 x 6
])
def test_what_dvpp_is_given(info, size, resize, takes):
    h, w = size
    kw = {} if resize == "stretch" else {"resize": resize}
    target = build_plan(ImageInput(**kw), spec((-1, h, w, 3)))
    assert dvpp_takes(info, target) is takes


def test_dvpp_is_given_the_plans_that_resize_bilinearly():
    """VPC resizes bilinearly whatever the plan asks: a plan of nearest, bicubic or area went to
    it all the same (a model trained on nearest's single pixels got smoothed ones, unsaid); now the
    CPU decodes them, with the interpolation set."""
    info = ImageInfo("JPEG", 640, 480, baseline=True)
    for interpolation, takes in (("bilinear", True), ("nearest", False), ("bicubic", False), ("area", False)):
        assert dvpp_takes(info, plan(224, 224, interpolation=interpolation)) is takes, interpolation


def test_what_rules_a_plan_out_of_dvpp_whatever_the_picture_and_the_soc():
    """plan_refusals, said at load: its sides past VPC's output on every SoC (a height of 4,224
    is within the 310B's), besides resize, interpolation and odd sides (tests/server/
    test_server_dvpp.py); a plan it lets by is taken for some picture."""
    assert plan_refusals(plan(8, 8)) == ["its size 8x8 is outside VPC's output (10-4,096 wide, 6-8,192 high at most)"]
    assert plan_refusals(plan(9000, 224)) == [
        "its size 224x9000 is outside VPC's output (10-4,096 wide, 6-8,192 high at most)"]
    assert plan_refusals(plan(4224, 224)) == [] and plan_refusals(plan(224, 224)) == []
    assert dvpp_takes(ImageInfo("JPEG", 640, 480, baseline=True), plan(224, 224))
