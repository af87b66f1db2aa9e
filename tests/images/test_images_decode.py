"""Decoding and fitting one image to a plan (Pillow on the CPU), the plans themselves, the DVPP
colour conversion, and the bounded decode pool."""
from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from aclserve.config import ConfigError, ImageInput, TensorOptions
from aclserve.errors import Overloaded, PayloadTooLarge, QueueFull
from aclserve.images import DecodePool, ImageStage, PlanError, build_plan
from aclserve.images.decode import CpuDecoder, decode_pixels
from aclserve.images.header import ImageError
from aclserve.images.dvpp import dvpp_takes, jpegd_width_align, nv12_to_pixels, plan_refusals, vpc_output
from aclserve.images.header import ImageInfo
from aclserve.runtime.types import TensorSpec
from tests.tiny_models import MEAN, STD
from .images_data import encode, gradient, lossless_jpeg, white_bilevel_png

LIMITS = (40_000_000, 16384)


def spec(shape, datatype="UINT8", fmt="NHWC"):
    dtype = {"UINT8": np.uint8, "FP32": np.float32, "FP16": np.float16, "INT32": np.int32}[datatype]
    return TensorSpec("x", datatype, np.dtype(dtype), tuple(shape), fmt)


def plan(h=8, w=8, c=3, **kw):
    return build_plan(ImageInput(**kw), spec((-1, h, w, c)))


def test_stretch_gives_model_size_in_colour_order():
    pic = gradient(40, 60)
    rgb = decode_pixels(encode(pic), plan(20, 30), *LIMITS)
    bgr = decode_pixels(encode(pic), plan(20, 30, color="bgr"), *LIMITS)
    assert rgb.shape == (20, 30, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(bgr, rgb[:, :, ::-1])
    # the same as Pillow's own antialiased resize of the decoded picture
    expected = np.asarray(Image.fromarray(pic).resize((30, 20), Image.BILINEAR))
    np.testing.assert_array_equal(rgb, expected)


def test_center_crop_and_letterbox():
    pic = np.zeros((40, 80, 3), np.uint8)
    pic[:, :15] = 255  # a white band at the left edge
    crop = decode_pixels(encode(pic), plan(20, 20, resize="center_crop"), *LIMITS)
    assert crop.shape == (20, 20, 3) and crop.max() == 0  # the centre square misses the band
    boxed = plan(20, 20, resize="letterbox", pad_value=7)
    inside = decode_pixels(encode(pic), boxed, *LIMITS)
    box = boxed.to_row(inside)
    assert inside.shape == (10, 20, 3) and box.shape == (20, 20, 3)
    assert (box[:5] == 7).all() and (box[15:] == 7).all()  # 80x40 fits as 20x10, padded above and below
    assert box[5:15, :3].min() > 200 and box[5:15, 5:].max() == 0


def test_center_crop_of_the_whole_side_takes_every_size():
    """crop_fraction 1.0 (the default): the box's side came out a hair past the picture's for
    2-8 % of sizes (an independent tester's sweep: 98x99, 98x106, 99x98 to 64x64), and Pillow
    refused its negative offset, a 400 saying the picture could not be decoded."""
    for w, h in ((98, 99), (98, 106), (99, 98), (640, 427)):
        pic = np.full((h, w, 3), 90, np.uint8)
        out = decode_pixels(encode(pic, "PNG"), plan(64, 64, resize="center_crop", crop_fraction=1.0), *LIMITS)
        assert out.shape == (64, 64, 3) and (out == 90).all(), (w, h)


def test_grey_alpha_sixteen_bit_and_palette():
    grey = decode_pixels(encode(gradient(16, 16)), plan(16, 16, 1), *LIMITS)
    assert grey.shape == (16, 16, 1)
    rgba = np.dstack([gradient(16, 16), np.full((16, 16), 3, np.uint8)])
    np.testing.assert_array_equal(decode_pixels(encode(rgba), plan(16, 16, resize="stretch"), *LIMITS),
                                  gradient(16, 16))  # alpha dropped, colours kept
    deep = (np.arange(256, dtype=np.uint16).reshape(16, 16) * 257)
    buf = io.BytesIO()
    Image.fromarray(deep).save(buf, "PNG")  # 16-bit grey
    np.testing.assert_array_equal(decode_pixels(buf.getvalue(), plan(16, 16, 1), *LIMITS)[:, :, 0],
                                  np.arange(256).reshape(16, 16))
    buf = io.BytesIO()
    Image.fromarray(gradient(16, 16)).convert("P").save(buf, "PNG")
    assert decode_pixels(buf.getvalue(), plan(16, 16), *LIMITS).shape == (16, 16, 3)


@pytest.mark.parametrize("fmt, options", [("JPEG", {"quality": 95}), ("PNG", {})])  # PNG's was ignored
def test_exif_orientation_is_applied(fmt, options):
    pic = np.zeros((20, 40, 3), np.uint8)
    pic[:10, :20] = 255  # stored: white top-left quadrant
    im = Image.fromarray(pic)
    exif = im.getexif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    buf = io.BytesIO()
    im.save(buf, fmt, exif=exif.tobytes(), **options)
    out = decode_pixels(buf.getvalue(), plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_malformed_exif_block_still_turns_the_picture(fmt):
    """Orientation 6 beside a Make tag (ASCII in TIFF) stored as a RATIONAL: Pillow's
    exif_transpose writes the block back and raised AttributeError (a 500 to the client)."""
    ifd = struct.pack("<H", 2) + struct.pack("<HHII", 0x010F, 5, 1, 8 + 2 + 24 + 4)
    ifd += struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack("<I", 0)
    exif = b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<II", 1, 1)
    pic = np.zeros((20, 40, 3), np.uint8)
    pic[:10, :20] = 255  # stored: white top-left quadrant
    buf = io.BytesIO()
    Image.fromarray(pic).save(buf, fmt, exif=exif if fmt == "JPEG" else exif[6:])
    out = decode_pixels(buf.getvalue(), plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:len(d) // 2], r"^PNG could not be decoded \(image file is truncated"),  # (not "its EXIF")
    (lambda d: d[:40] + bytes(len(d) - 40), r"PNG is truncated \(or corrupt\) before its image data"),
])
def test_broken_images_say_so(mutate, message):
    data = mutate(encode(gradient(64, 64)))
    with pytest.raises(ImageError, match=message):
        decode_pixels(data, plan(8, 8), *LIMITS)


def test_a_decoder_message_says_why_and_names_no_object_of_the_server():
    """A PNG whose chunk before the image data fails its CRC check: Pillow "cannot identify image
    file <_io.BytesIO object at 0x...>", an address of the server's (found by an independent
    soak), and no reason (an independent tester); said with Pillow's reason, without it."""
    data = encode(gradient(32, 32))
    text = b"tEXt" + b"k\0v"
    data = data[:33] + struct.pack(">I", 3) + text + bytes(4) + data[33:]  # a tEXt chunk, its CRC zero
    with pytest.raises(ImageError) as e:
        decode_pixels(data, plan(8, 8), *LIMITS)
    assert str(e.value) == "PNG could not be decoded (broken PNG file (bad header checksum in b'tEXt'))"


@pytest.mark.parametrize("chunk, named", [
    (b"iCCP" + b"icc\0\0", "its ICC profile (iCCP chunk)"),
    (b"zTXt" + b"exif\0\0", "a zTXt text chunk"),  # (one Pillow reads an orientation from: still given to it)
], ids=["ICC profile", "zTXt"])
def test_a_chunk_inflating_past_pillows_cap_is_named(chunk, named):
    """Pillow refuses a PNG whose ICC profile inflates past 1 MB saying only "Decompressed data
    too large for PngImagePlugin.MAX_TEXT_CHUNK" (found by tester t88): the chunk is named."""
    payload = chunk[4:] + zlib.compress(bytes(2 << 20))
    data = encode(gradient(32, 32))
    data = data[:33] + struct.pack(">I", len(payload)) + chunk[:4] + payload + struct.pack(
        ">I", zlib.crc32(chunk[:4] + payload)) + data[33:]
    with pytest.raises(ImageError) as e:
        decode_pixels(memoryview(data), plan(8, 8), *LIMITS)
    assert str(e.value) == (f"PNG could not be decoded ({named} inflates past 1,048,576 bytes, Pillow's "
                            f"PngImagePlugin.MAX_TEXT_CHUNK)")


def test_a_lossless_jpeg_decodes_at_full_size():
    """libjpeg (libjpeg-turbo 3, in Pillow's wheels) decodes a lossless JPEG but cannot scale
    it: the draft asked for a smaller target made it "could not be decoded (broken data stream
    when reading image file)"."""
    grey = gradient(48, 64, 1)
    data = lossless_jpeg(grey)
    want = np.asarray(Image.fromarray(grey).convert("RGB").resize((16, 12), Image.BILINEAR))
    assert (decode_pixels(data, plan(12, 16), *LIMITS) == want).all()
    assert (decode_pixels(data, plan(12, 16, 1, color="gray"), *LIMITS)[:, :, 0]
            == np.asarray(Image.fromarray(grey).resize((16, 12), Image.BILINEAR))).all()


def test_mutated_images_fail_only_with_image_error():
    """Random byte changes and cuts in JPEGs (with EXIF) and PNGs: every failure is an
    ImageError (a 400 with its message), never another exception (a 500)."""
    rng = np.random.default_rng(5)
    im = Image.fromarray(gradient(40, 50))
    exif = im.getexif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    im.save(buf, "JPEG", exif=exif.tobytes())
    png = io.BytesIO()
    im.save(png, "PNG", exif=exif.tobytes())
    seeds = [buf.getvalue(), encode(gradient(40, 50)), encode(gradient(40, 50), "JPEG", progressive=True),
             encode(gradient(30, 30, 1)), png.getvalue()]
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(600):
        data = bytearray(seeds[rng.integers(len(seeds))])
        for _ in range(rng.integers(1, 7)):
            data[rng.integers(len(data))] = rng.integers(256)
        if rng.random() < 0.2:
            data = data[:rng.integers(len(data))]
        try:
            decode_pixels(bytes(data), plan(16, 16), *LIMITS)
            outcomes["decoded"] += 1
        except ImageError:
            outcomes["refused"] += 1
    assert outcomes["decoded"] and outcomes["refused"]


def test_truncated_jpeg_is_refused():
    data = encode(gradient(64, 64), "JPEG")
    in_image_data = (data.index(b"\xff\xda") + len(data)) // 2
    with pytest.raises(ImageError, match="JPEG could not be decoded"):
        decode_pixels(data[:in_image_data], plan(8, 8), *LIMITS)
    with pytest.raises(ImageError, match="^JPEG is truncated before its image data$"):  # cut in its headers
        decode_pixels(data[:len(data) // 3], plan(8, 8), *LIMITS)


def test_float_plans_normalise_on_the_host():
    p = build_plan(ImageInput(mean=(10.0, 20.0, 30.0), std=(2.0,)), spec((-1, 3, 4, 5), "FP32", "NCHW"))
    assert (p.layout, p.height, p.width, p.channels) == ("NCHW", 4, 5, 3)
    pixels = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    row = p.to_row(pixels)
    np.testing.assert_allclose(row, ((pixels - np.array([10, 20, 30])) / 2.0).transpose(2, 0, 1), rtol=1e-6)
    assert row.dtype == np.float32
    nhwc = build_plan(ImageInput(), spec((-1, 4, 5, 3), "FP16", "ND"))
    assert nhwc.layout == "NHWC" and nhwc.to_row(pixels).dtype == np.float16
    # an ONNX input is NCHW to ATC whatever its layout: where that axis cannot be the channels,
    # the dims decide (it was refused as an image of 4 channels)
    assert build_plan(ImageInput(), spec((-1, 4, 5, 3), "FP32", "NCHW")).layout == "NHWC"
    grey = build_plan(ImageInput(), spec((2, 4, 5), "FP32", "ND"))
    assert (grey.layout, grey.rows, grey.color) == ("HW", 2, "gray")
    # a uint8 one's rows too have no channel axis (they kept it: the batch failed, a 500)
    assert build_plan(ImageInput(), spec((-1, 4, 5))).to_row(pixels[:, :, :1]).shape == (4, 5)


def test_a_bgr_plans_mean_and_std_are_b_g_r():
    """Host normalisation takes mean/std in `color`'s order, the model's (default.yaml and README
    say so; compile's --image-input bgr --mean, AIPP's, is R,G,B: tests/om/test_om_aipp.py)."""
    picture = encode(np.full((2, 2, 3), (200, 100, 50), np.uint8))  # R, G, B
    for color, want in (("rgb", [190, 40, 4]), ("bgr", [40, 40, 34])):  # (B 50 - 10) / 1, (R 200 - 30) / 5
        p = build_plan(ImageInput(color=color, mean=(10, 20, 30), std=(1, 2, 5)), spec((-1, 3, 2, 2), "FP32", "NCHW"))
        assert p.to_row(decode_pixels(picture, p, *LIMITS))[:, 0, 0].tolist() == want, color


def test_plans_compare_by_key_their_arrays_included():
    """A hot reload compares the old and new versions' plans (repository/served.py): the
    dataclass's own == raised on their mean/std arrays (found by an independent check: a 500)."""
    def normalising(mean):
        return build_plan(ImageInput(mean=mean, std=(2.0,)), spec((-1, 3, 4, 5), "FP32", "NCHW"))
    assert normalising((10.0, 20.0, 30.0)).key() == normalising((10.0, 20.0, 30.0)).key()
    assert normalising((10.0, 20.0, 30.0)).key() != normalising((10.0, 20.0, 31.0)).key()


def test_invert():
    dark_on_light = np.full((8, 8, 1), 250, np.uint8)
    dark_on_light[2:6, 3:5] = 0
    auto = plan(8, 8, 1, invert="auto")
    assert auto.to_row(dark_on_light)[0, 0, 0] == 5 and auto.to_row(255 - dark_on_light)[0, 0, 0] == 5
    assert plan(8, 8, 1, invert=True).to_row(dark_on_light)[3, 3, 0] == 255


def test_a_letterbox_is_padded_after_invert_which_judges_the_picture_alone():
    """The padding was most of a letterboxed picture's border: with pad_value 0, auto never
    inverted a dark figure on light ground fitted into a wider box (found by a fuzz of the image
    inputs), and `invert: true` turned the fill the model was to see into 255 - pad_value."""
    dark_on_light = np.full((8, 4, 1), 250, np.uint8)
    dark_on_light[2:6, 1:3] = 0
    auto = plan(8, 8, 1, invert="auto", resize="letterbox", pad_value=0)
    row = auto.to_row(dark_on_light)
    assert row.shape == (8, 8, 1) and (row[:, :2] == 0).all() and (row[:, 6:] == 0).all()  # the fill as set
    assert row[0, 2, 0] == 5 and row[3, 3, 0] == 255  # the picture inverted
    assert plan(8, 8, 1, invert=True, resize="letterbox", pad_value=9).to_row(dark_on_light)[0, 0, 0] == 9


def test_a_letterbox_fill_is_a_pixel_value_normalised_with_the_picture():
    """pad_value is in pixel units and goes through a float input's mean/std as the picture does
    (the config's comment said "as the model sees it": an independent tester found 0 reached the
    model as -2 with mean 100, std 50); as set for a uint8 input."""
    boxed = build_plan(ImageInput(resize="letterbox", pad_value=0, mean=(100.0,), std=(50.0,)),
                       spec((-1, 3, 4, 4), "FP32", "NCHW"))
    row = boxed.to_row(np.full((2, 4, 3), 200, np.uint8))
    assert (row[:, [0, 3]] == -2).all() and (row[:, 1:3] == 2).all()
    assert (plan(4, 4, resize="letterbox", pad_value=0).to_row(np.full((2, 4, 3), 200, np.uint8))[[0, 3]] == 0).all()


@pytest.mark.parametrize("image, shape, datatype, message", [
    (ImageInput(mean=(1.0,)), (-1, 8, 8, 3), "UINT8", "remove mean/std"),
    (ImageInput(), (-1, 8, 8, 2), "UINT8", "2 channels"),
    (ImageInput(color="gray"), (-1, 8, 8, 3), "UINT8", "color gray does not fit 3"),
    (ImageInput(), (-1, 8, 8, 3), "INT32", "images feed UINT8 or float"),
    (ImageInput(), (-1, 64), "FP32", "must be \\[N, H, W, C\\]"),
    (ImageInput(std=(1.0, 2.0)), (-1, 3, 8, 8), "FP32", "std has 2 values for 3"),
    (ImageInput(layout="NHWC"), (-1, 3, 8, 8), "FP32",  # the layout set is the mistake: say it
     "8 channels, as layout NHWC reads its dims \\[3, 8, 8\\] \\(is that its layout\\?\\)"),
])
def test_plans_that_do_not_fit_the_model_are_refused(image, shape, datatype, message):
    with pytest.raises(PlanError, match=message):
        build_plan(image, spec(shape, datatype, "ND"))


def test_a_refusal_for_mean_or_std_is_keyed_by_the_one_given():
    """A refusal whose words name mean/std is keyed by one of them, so that the load blames the
    file that gave it (repository/settings_fit.py): keyed inputs.x.image, it was blamed on the
    model's own file whenever that gave any image setting, model_defaults' mean and std included
    (reviewer r22)."""
    uint8, fp16 = spec((-1, 8, 8, 3), "UINT8", "ND"), spec((-1, 3, 4, 4), "FP16", "NCHW")
    for image, target, key in ((ImageInput(mean=(1.0,)), uint8, "inputs.x.image.mean"),
                               (ImageInput(std=(2.0,)), uint8, "inputs.x.image.std"),
                               (ImageInput(mean=(1.0,), std=(0.001,)), fp16, "inputs.x.image.std"),
                               (ImageInput(mean=(1e5,)), fp16, "inputs.x.image.mean")):
        with pytest.raises(PlanError) as refused:
            build_plan(image, target)
        assert refused.value.key == key and not refused.value.said.startswith(("mean", "std")), refused.value


def test_model_defaults_passed_over_are_not_told_to_be_removed_a_models_own_are(caplog):
    """model_defaults' mean/std passed over for a uint8 (AIPP) input said so in an INFO line ending
    "...; remove mean/std": done in model_defaults, that breaks the float models they were meant for
    (found in review). The INFO line says what does not fit; a model's own config that gives them
    is refused with the advice still."""
    uint8 = [spec((-1, 8, 8, 3), "UINT8", "NHWC")]
    raw = [dataclasses.replace(spec((-1, 96, 64), "UINT8", "ND"), raw_aipp_format="YUV420SP_U8")]
    normalised = ImageInput(mean=(120.0,), std=(60.0,))
    defaults = frozenset({"image"})
    with caplog.at_level(logging.INFO, logger="aclserve.images"):
        assert ImageStage.for_model({"x": TensorOptions(image=normalised, from_defaults=defaults)}, uint8, "m")
        assert ImageStage.for_model({"x": TensorOptions(image=ImageInput(), from_defaults=defaults)}, raw, "m") is None
    assert [r.getMessage() for r in caplog.records] == [
        "m: model_defaults' inputs.x.image.mean and std passed over: the model takes uint8 pixels (AIPP normalises on "
        "the device); the input takes its pictures' pixel values, 0-255, as they are",
        "m: model_defaults' inputs.x.image passed over: its static AIPP takes YUV420SP_U8, which images do not feed; "
        "clients send that buffer as UINT8 [-1, 96, 64]"]
    for options, inputs, said in (
            (TensorOptions(image=normalised), uint8, "inputs.x.image.mean: the model takes uint8 pixels (AIPP "
                                                     "normalises on the device); remove mean/std"),
            (TensorOptions(image=ImageInput()), raw, "inputs.x.image: its static AIPP takes YUV420SP_U8, which images "
                                                     "do not feed; clients send that buffer as UINT8 [-1, 96, 64] "
                                                     "(remove its image settings)")):
        with pytest.raises(ConfigError) as refused:
            ImageStage.for_model({"x": options}, inputs, "m")
        assert str(refused.value) == said


def test_host_normalisation_beyond_the_inputs_type_is_refused():
    """An FP16 input whose mean/std made pixels into values past 65504 loaded and got inf
    silently (std 0.001: a flat picture of 200 was all inf; an independent tester), where JSON
    data past FP16's range gets 400: refused at load now, naming mean, std and the bound."""
    fp16, fp32 = spec((-1, 3, 4, 4), "FP16", "NCHW"), spec((-1, 3, 4, 4), "FP32", "NCHW")
    with pytest.raises(PlanError, match=r"^image input 'x': with mean \[0, 0, 0\] and std \[0.001, 0.001, 0.001\], "
                       r"pixels 0-255 become values up to 255000 in size, beyond FP16's largest, 65504 \(the model "
                       r"would get inf\); mean and std are in pixel units, 0-255$"):
        build_plan(ImageInput(interpolation="nearest", mean=(0.0, 0.0, 0.0), std=(0.001,) * 3), fp16)
    for image, target, largest in ((ImageInput(std=(1.0, 0.0038, 1.0)), fp16, "67105.3"),  # pixel 255, 2nd channel
                                   (ImageInput(mean=(1e5,)), fp16, "100000"),  # pixel 0, no std
                                   (ImageInput(std=(1e-40,)), fp32, r"2.55\d*e\+42"),  # a float32 denormal
                                   (ImageInput(std=(1e-46,)), fp32, "inf")):  # 0 as a float32
        with pytest.raises(PlanError, match=f"values up to {largest} in size, beyond"):
            build_plan(image, target)
    edge = build_plan(ImageInput(mean=(0.0,), std=(0.004,)), fp16)  # 255 / 0.004: 63,750
    row = edge.to_row(np.full((4, 4, 3), 255, np.uint8))
    assert row.dtype == np.float16 and np.isfinite(row).all() and row.max() > 63_000
    white = np.full((4, 4, 3), 255, np.uint8)
    assert build_plan(ImageInput(mean=(0.0,), std=(1e-36,)), fp32).to_row(white).max() > 1e38


def test_a_mean_and_std_in_torchvisions_units_are_warned_of_at_load(caplog):
    """mean 0.485 and std 0.229 (torchvision's, for pixels scaled to 0-1) make a white pixel 1,111,
    not 2.2: the load goes on, with a WARNING naming the model and the input."""
    fp32 = [spec((-1, 3, 4, 4), "FP32", "NCHW")]
    torchvision = ImageInput(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    with caplog.at_level(logging.WARNING):
        assert ImageStage.for_model({"x": TensorOptions(image=torchvision)}, fp32, "resnet") is not None
    assert ("resnet: image input 'x': mean and std are all below 1, as for pixels scaled to 0-1 (torchvision's "
            "Normalize), but they are in pixel units, 0-255: multiply them by 255") in caplog.text
    caplog.clear()
    for image in (ImageInput(mean=tuple(MEAN.tolist()), std=tuple(STD.tolist())), ImageInput(mean=(0.5,)),
                  ImageInput(mean=(127.5,), std=(0.5,)), ImageInput()):  # pixel units, or no std below 1 alone
        with caplog.at_level(logging.WARNING):
            ImageStage.for_model({"x": TensorOptions(image=image)}, fp32, "resnet")
    assert "below 1" not in caplog.text


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


def test_pool_bounds_pending_images_and_keeps_order():
    async def main():
        pool = DecodePool(workers=2, max_pending=4)
        try:
            assert (await pool.map(lambda i: i * i, [1, 2, 3, 4])).results == [1, 4, 9, 16]
            gate = threading.Event()
            busy = asyncio.ensure_future(pool.map(lambda i: gate.wait(60), [1, 2, 3]))
            await asyncio.sleep(0)  # its three jobs are in
            with pytest.raises(QueueFull, match="images.max_pending"):  # saturated: retry later
                await pool.map(lambda i: i, [1, 2])
            gate.set()
            assert (await busy).results == [True] * 3
            # more than the pool ever takes at once: no retry can help
            with pytest.raises(PayloadTooLarge, match="holds 5 images, more than are decoded at once"):
                await pool.map(lambda i: i, list(range(5)))
            with pytest.raises(ValueError, match="row 1"):
                await pool.map(lambda i: (_ for _ in ()).throw(ValueError(f"row {i}")) if i else i, [0, 1, 2])
            await asyncio.sleep(0)
            for _ in range(100):  # the done callbacks release through the loop
                if pool.pending == 0:
                    break
                await asyncio.sleep(0.01)
            assert pool.pending == 0
        finally:
            pool.close()
        inline = DecodePool(workers=0, max_pending=1)
        assert (await inline.map(str, [1, 2, 3])).results == ["1", "2", "3"]  # workers 0: on the loop, no bound
        inline.close()
    asyncio.run(main())


def test_a_decoding_thread_that_cannot_start_is_a_retry_later(monkeypatch):
    """At the process's thread limit starting a thread raises "can't start new thread", which
    was taken for a shutdown: a 500 and a traceback (found by running the server under `ulimit -u`)."""
    def no_thread(thread):
        raise RuntimeError("can't start new thread")

    async def main():
        pool = DecodePool(workers=2, max_pending=4)
        try:
            monkeypatch.setattr(threading.Thread, "start", no_thread)
            with pytest.raises(Overloaded, match=r"image decoding cannot start a thread \(can't start new thread\)"):
                await pool.map(lambda i: i, [1, 2])
            assert pool.pending == 0  # nothing was queued for a thread that never came
            monkeypatch.undo()
            assert (await pool.map(lambda i: i * i, [1, 2])).results == [1, 4]
        finally:
            pool.close()
    asyncio.run(main())


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


def test_images_max_pixels_above_pillow_s_own_limit_is_the_limit(monkeypatch):
    """Pillow refuses by itself a picture of over twice Image.MAX_IMAGE_PIXELS (179 M pixels by
    default): with images.max_pixels at 400 M, a 1-bit PNG of 13400 x 13400 (179.6 M) was a 400
    "PNG is too large to decode", naming neither limit (an independent tester)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # Pillow's default, whatever ran before
    data = white_bilevel_png(13400, 13400)
    decoder = CpuDecoder(400_000_000, 16384)
    assert (decoder(data, plan(8, 8, 1, interpolation="area")) == 255).all()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # lowered since: said so
    with pytest.raises(ImageError, match=r"PNG of 179,560,000 pixels is over Pillow's own limit .* images.max_pixels"):
        decoder(data, plan(8, 8, 1))
