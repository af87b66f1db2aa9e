"""Image plans: host normalisation (mean and std in the model's colour order, a letterbox's fill
normalised with the picture), invert, plans compared by key, and the refusals of plans that do not
fit the model or its input's type, each keyed by what it blames; model_defaults' values passed
over, and torchvision's units, said at load."""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from aclserve.config import ConfigError, ImageInput, TensorOptions
from aclserve.images import ImageStage, PlanError, build_plan
from aclserve.images.decode import decode_pixels
from tests.tiny_models import MEAN, STD
from .image_plans import LIMITS, plan, spec
from .images_data import encode


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
