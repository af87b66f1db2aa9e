"""ImagePlan: how encoded images become rows of one model input, fixed when a version loads.

Built from the input's `image` settings (config.ImageInput) and the model's TensorSpec:
  - uint8 [N, H, W, C] (an OM with AIPP, or any NHWC uint8 input): pixels as they are, in the
    colour order given; mean/std are refused (the device normalises);
  - float [N, C, H, W] / [N, H, W, C] / [N, H, W] (grey): (pixel - mean) / std on the host, in
    float32, then the model's float type.
A plan that does not fit the model raises PlanError at load, naming the input and the setting.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import numpy as np

from ..config import ImageInput
from ..config.image_values import normalised_extent
from ..runtime.types import TensorSpec

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """The image settings do not fit the model input `input`: `setting` names the one at fault
    ("mean"; "" for them as a whole), `problem` what is wrong, with `remedy` (what to change in the
    model's own config: "; remove mean/std") after it; the message names the input. `blamed`: the
    setting the key names where the problem's words name it already (mean/std)."""

    def __init__(self, input: str, problem: str, setting: str = "", blamed: str = "", remedy: str = ""):
        self.input, self.setting, self._found = input, setting, problem
        self.problem = problem + remedy
        self._blamed = blamed or setting
        super().__init__(f"image input {input!r}: {self.said}")

    @property
    def said(self) -> str:
        """What is wrong, after the setting at fault: "mean has 2 values for 3 channel(s)"."""
        return f"{self.setting} {self.problem}" if self.setting else self.problem

    @property
    def found(self) -> str:
        """`said` without the remedy: for model_defaults' settings passed over (stage.py), meant
        for every model, where removing them would break the models they fit."""
        return f"{self.setting} {self._found}" if self.setting else self._found

    @property
    def key(self) -> str:
        """The dotted key of the setting at fault in a model's config: inputs.x.image.mean."""
        return f"inputs.{self.input}.image" + (f".{self._blamed}" if self._blamed else "")


@dataclass(frozen=True)
class ImagePlan:
    input: str
    height: int
    width: int
    channels: int  # 1 or 3
    color: str  # rgb | bgr | gray
    resize: str
    crop_fraction: float
    interpolation: str
    pad_value: int
    layout: str  # NHWC | NCHW | HW (grey without a channel axis)
    dtype: np.dtype  # what the model input takes
    mean: np.ndarray | None  # float32 [C], host normalisation (float inputs)
    std: np.ndarray | None
    rows: int  # -1: batched (any count up to the batch limit); else the fixed row count
    invert: bool | str = False

    def key(self) -> tuple:
        """Its fields, arrays by their bytes: two plans that prepare pixels alike have equal keys
        (the dataclass's own == compares the arrays elementwise and cannot answer)."""
        values = (getattr(self, f.name) for f in fields(self))
        return tuple(v.tobytes() if isinstance(v, np.ndarray) else v for v in values)

    @property
    def row_shape(self) -> tuple[int, ...]:
        """One row of the model input: [C, H, W], [H, W, C] or [H, W]."""
        if self.layout == "NCHW":
            return self.channels, self.height, self.width
        return (self.height, self.width, self.channels) if self.layout == "NHWC" else (self.height, self.width)

    @property
    def row_bytes(self) -> int:
        """What one row of the model input holds: a picture's share of the request's tensor."""
        return self.height * self.width * self.channels * self.dtype.itemsize

    def to_row(self, pixels: np.ndarray) -> np.ndarray:
        """One row of the model input, a new array, made of `pixels` as write_row makes it."""
        row = np.empty(self.row_shape, self.dtype)
        self.write_row(pixels, row)
        return row

    def write_row(self, pixels: np.ndarray, row: np.ndarray) -> None:
        """uint8 [H, W, C] in this plan's colour order, fitted (letterbox: the picture inside) ->
        `row` (row_shape, the plan's dtype: a row of the request's input tensor), in place. A
        letterbox is padded after `invert`: auto judges the picture's own border (the padding was
        most of it), and pad_value is not inverted; it is padded before mean/std, which it goes
        through as the pixels do (0 with mean 100, std 50: -2). A float32 row is normalised where
        it lies; a float16 one in a float32 picture first (the host normalises in float32)."""
        if self.invert is True or (self.invert == "auto" and _light_border(pixels)):
            pixels = 255 - pixels
        if self.resize == "letterbox":
            pixels = self._pad(pixels)
        if self.layout == "NCHW":
            pixels = pixels.transpose(2, 0, 1)
        elif self.layout == "HW":
            pixels = pixels[:, :, 0]
        if self.mean is None and self.std is None:  # (uint8, or a float input taking pixel values)
            np.copyto(row, pixels)
            return
        work = row if self.dtype == np.float32 else np.empty(row.shape, np.float32)
        np.copyto(work, pixels)
        if self.mean is not None:
            work -= self._per_pixel(self.mean)
        if self.std is not None:
            work /= self._per_pixel(self.std)
        if work is not row:
            np.copyto(row, work)

    def _per_pixel(self, values: np.ndarray) -> np.ndarray:
        """Per-channel values shaped to broadcast over a row of this layout."""
        return values.reshape(-1, 1, 1) if self.layout == "NCHW" else values

    def _pad(self, pixels: np.ndarray) -> np.ndarray:
        h, w = pixels.shape[:2]
        out = np.full((self.height, self.width) + pixels.shape[2:], self.pad_value, np.uint8)
        top, left = (self.height - h) // 2, (self.width - w) // 2
        out[top:top + h, left:left + w] = pixels
        return out

    def describe(self) -> dict:
        """What model metadata shows about this input."""
        return {"content": "image", "formats": "jpeg,png", "color": self.color, "size": f"{self.width}x{self.height}",
                "resize": self.resize, "tensor_datatype": "UINT8" if self.dtype == np.uint8 else
                "FP16" if self.dtype == np.float16 else "FP32"}


def build_plan(image: ImageInput, spec: TensorSpec) -> ImagePlan:
    name = spec.name
    dims = list(spec.shape[1:])
    rows = -1 if spec.batched else (spec.shape[0] if spec.shape else 0)
    if spec.raw_aipp_format:
        raise PlanError(name, f"its static AIPP takes {spec.raw_aipp_format}, which images do not feed; clients "
                              f"send that buffer as UINT8 {list(spec.shape)}", remedy=" (remove its image settings)")
    if rows == 0 or len(dims) not in (2, 3):
        raise PlanError(name, f"the model input must be [N, H, W, C], [N, C, H, W] or [N, H, W]; it is "
                              f"{list(spec.shape)}")
    if spec.dtype == np.uint8:
        layout = "NHWC" if len(dims) == 3 else "HW"
        if image.mean is not None or image.std is not None:
            raise PlanError(name, "the model takes uint8 pixels (AIPP normalises on the device)",
                            blamed="mean" if image.mean is not None else "std",  # (where either came from)
                            remedy="; remove mean/std")
        if image.layout not in ("auto", "NHWC"):
            raise PlanError(name, f"must be NHWC (or auto) for a uint8 input, got {image.layout}", "layout")
    elif spec.dtype.kind == "f" and spec.dtype.itemsize <= 4:
        layout = _float_layout(image.layout, spec, dims)
    else:
        raise PlanError(name, f"the model input is {spec.datatype}; images feed UINT8 or float inputs")
    if layout == "NCHW":
        channels, height, width = dims
    elif layout == "NHWC":
        height, width, channels = dims
    else:
        (height, width), channels = dims, 1
    if channels not in (1, 3):
        said = (f", as layout {image.layout} reads its dims {dims} (is that its layout?)"
                if image.layout != "auto" else "")
        raise PlanError(name, f"{channels} channels{said}; images give 1 (gray) or 3 (rgb/bgr)")
    # unsaid, the pixels the input's AIPP takes (an RGB888 AIPP swapping R and B takes BGR)
    color = image.color or spec.aipp_color or ("gray" if channels == 1 else "rgb")
    if image.color is None and spec.aipp_color == "bgr":  # the one order that differs from before
        log.info("image input %r takes BGR pixels: its static AIPP swaps R and B (say color: rgb if it "
                 "was built to give a BGR-trained network RGB pixels)", name)
    if (color == "gray") != (channels == 1):
        raise PlanError(name, f"{color} does not fit {channels} channel(s)", "color")
    mean = _per_channel(image.mean, channels, name, "mean")
    std = _per_channel(image.std, channels, name, "std")
    _check_range(name, spec, image, mean, std)
    return ImagePlan(name, height, width, channels, color, image.resize, image.crop_fraction, image.interpolation,
                     image.pad_value, layout, np.dtype(spec.dtype), mean, std, rows, image.invert)


def _light_border(pixels: np.ndarray) -> bool:
    """More than half of the border pixels are light: a dark figure on a light background."""
    border = np.concatenate([pixels[0].ravel(), pixels[-1].ravel(), pixels[:, 0].ravel(), pixels[:, -1].ravel()])
    return bool(np.median(border) > 127)


def _float_layout(wanted: str, spec: TensorSpec, dims: list[int]) -> str:
    if len(dims) == 2:
        return "HW"
    if wanted != "auto":
        return wanted
    return picture_layout(spec.format, dims) or "NCHW"


def picture_layout(om_format: str, dims) -> str | None:
    """The layout of a tensor of three dimensions besides the batch laid out as a picture (1 or 3
    channels first, or last): "NCHW" or "NHWC"; None for any other. The OM's format is ATC's
    --input_format: NHWC only where it was asked for (a TF or Caffe model); NCHW for every ONNX
    input whatever its layout, so then the dims decide."""
    if len(dims) != 3:
        return None
    if om_format == "NHWC" or (dims[2] in (1, 3) and dims[0] not in (1, 3)):
        return "NHWC"
    return "NCHW" if dims[0] in (1, 3) else None


def _check_range(name: str, spec: TensorSpec, image: ImageInput, mean: np.ndarray | None,
                 std: np.ndarray | None) -> None:
    """(pixel - mean) / std of pixels 0 to 255, as write_row computes it (in float32), must be a
    finite value of the input's type: beyond it an FP16 input got inf silently (std 0.001: a flat
    picture of 200 was all inf), where JSON data out of FP16's range gets 400 and compile --std
    refuses a reciprocal an FP16 cannot hold. `mean`, `std`: image's, per channel, in float32."""
    if mean is None and std is None:
        return
    largest = normalised_extent(mean, std)  # (past FP32's largest, the config was refused: image_values.py)
    bound = float(np.finfo(spec.dtype).max)
    if largest > bound:
        given = " and ".join(f"{what} [{', '.join(f'{v:g}' for v in values)}]"
                             for what, values in (("mean", image.mean), ("std", image.std)) if values is not None)
        raise PlanError(name, f"with {given}, pixels 0-255 become values up to {largest:.6g} in size, beyond "
                              f"{spec.datatype}'s largest, {bound:g} (the model would get inf); mean and std are in "
                              "pixel units, 0-255", blamed="std" if image.std is not None else "mean")


def _per_channel(values, channels: int, name: str, what: str) -> np.ndarray | None:
    if values is None:
        return None
    if len(values) == 1:
        values = tuple(values) * channels
    if len(values) != channels:
        raise PlanError(name, f"has {len(values)} values for {channels} channel(s)", what)
    return np.array(values, np.float32)
