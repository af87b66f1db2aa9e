"""Static AIPP configs (ATC's `--insert_op_conf`): parse ATC's `aipp_op { ... }` text, generate
one for the common case, check it against the model, render it back (the syntax of ATC's AIPP
configuration file template, hicann/ge docs/zh/user_guides/atc_tools/AIPP/config_file_template.md).

Supported: `aipp_mode: static` with `input_format` RGB888_U8 (3 channels) or YUV400_U8
(1 channel, grey), source size, crop, R/B swap, mean/min/var_reci normalisation and padding.
Refused with one line: dynamic AIPP, YUV420SP and the other formats, colour-space conversion
(csc_switch), resize (reserved by ATC), ax_swap_switch, related_input_name (Caffe only). Both
compile targets take the same set, so a CPU OM and an ATC OM built from one config agree.
Pure functions; nothing here reads the model file, nor imports onnx (`aclserve compile` parses
and renders a config before its child compiles).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..soc_families import SocFamily, soc_family
from .compile_error import CompileError
from .plain_numbers import plain_number

if TYPE_CHECKING:
    from .spec import ModelSpec, TensorInfo

CHANNELS = {"RGB888_U8": 3, "YUV400_U8": 1}
_REFUSED_FORMATS = ("YUV420SP_U8", "XRGB8888_U8", "ARGB8888_U8", "YUYV_U8", "YUV422SP_U8", "AYUV444_U8",
                    "RAW10", "RAW12", "RAW16", "RAW24", "RGB16", "RGB20", "RGB24", "RGB8_IR", "RGB16_IR",
                    "RGB24_IR")
_INT_RANGES = {"related_input_rank": (0, 255), "src_image_size_w": (0, 4096), "src_image_size_h": (0, 4096),
               "load_start_pos_w": (0, 4095), "load_start_pos_h": (0, 4095), "crop_size_w": (0, 4096),
               "crop_size_h": (0, 4096), "left_padding_size": (0, 32), "right_padding_size": (0, 32),
               "top_padding_size": (0, 32), "bottom_padding_size": (0, 32)}
_BOOLS = ("crop", "padding", "rbuv_swap_switch", "csc_switch", "resize", "ax_swap_switch")
# Colour-space conversion parameters: meaningful only with csc_switch, which is refused.
_CSC_ONLY = re.compile(r"^(matrix_r[0-2]c[0-2]|input_bias_[0-2]|output_bias_[0-2])$")
_CHANNEL_KEY = re.compile(r"^(mean_chn|min_chn|var_reci_chn)_([0-3])$")
_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<tok>[{}:]|"[^"\n]*"|[^\s{}:#"]+)')
FP16_MAX = 65504.0


@dataclass(frozen=True)
class AippOp:
    """One static `aipp_op` block, defaults as ATC's template gives them."""

    related_input_rank: int = 0
    input_format: str = "RGB888_U8"
    src_image_size_w: int = 0
    src_image_size_h: int = 0
    crop: bool = False
    load_start_pos_w: int = 0
    load_start_pos_h: int = 0
    crop_size_w: int = 0
    crop_size_h: int = 0
    rbuv_swap_switch: bool = False
    padding: bool = False
    left_padding_size: int = 0
    right_padding_size: int = 0
    top_padding_size: int = 0
    bottom_padding_size: int = 0
    padding_value: float = 0.0
    mean_chn: tuple[int, ...] = (0, 0, 0, 0)
    min_chn: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    var_reci_chn: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)

    @property
    def channels(self) -> int:
        return CHANNELS[self.input_format]


@dataclass(frozen=True)
class BoundAipp:
    """An AippOp checked against the model input it feeds: the geometry both targets use."""

    op: AippOp
    input: TensorInfo  # the model's own NCHW input
    src_h: int
    src_w: int
    crop_box: tuple[int, int, int, int] | None  # (top, left, height, width) or None

    @property
    def image_dims(self) -> list[int]:
        """The OM input the host fills: [N, src_h, src_w, C] uint8 NHWC."""
        return [self.input.dims[0], self.src_h, self.src_w, self.op.channels]

    def summary(self) -> dict:
        """What inspect and the OM header show."""
        d = asdict(self.op)
        d["input"] = self.input.name
        d["model_input"] = {"datatype": self.input.header_entry()["datatype"], "dims": list(self.input.dims),
                            "format": "NCHW"}
        d["image_input"] = {"datatype": "UINT8", "dims": self.image_dims, "format": "NHWC"}
        d["mean_chn"], d["min_chn"], d["var_reci_chn"] = (list(v[:self.op.channels]) for v in
                                                          (self.op.mean_chn, self.op.min_chn, self.op.var_reci_chn))
        return d


# ---- parsing ---------------------------------------------------------------------------------

def _tokens(text: str, where: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # an unclosed quote
            raise CompileError(f"{where}: cannot read {text[pos:pos + 20]!r} (unclosed quote?)")
        if m.group("tok"):
            out.append(m.group("tok"))
        pos = m.end()
    return out


def parse(text: str, where: str = "AIPP config") -> list[AippOp]:
    """ATC's aipp config text -> one AippOp per `aipp_op` block. Raises CompileError (one line)."""
    toks = _tokens(text, where)
    ops, i = [], 0
    while i < len(toks):
        if toks[i] != "aipp_op":
            raise CompileError(f"{where}: expected an 'aipp_op {{ ... }}' block, found {toks[i]!r}")
        i += 1
        if i < len(toks) and toks[i] == ":":
            i += 1
        if i >= len(toks) or toks[i] != "{":
            raise CompileError(f"{where}: 'aipp_op' must be followed by '{{'")
        i += 1
        fields: dict[str, str] = {}
        while True:
            if i >= len(toks):
                raise CompileError(f"{where}: aipp_op block {len(ops) + 1} is not closed with '}}'")
            if toks[i] == "}":
                i += 1
                break
            if i + 2 >= len(toks) or toks[i + 1] != ":" or toks[i + 2] in "{}:":
                raise CompileError(f"{where}: expected 'key: value' in aipp_op block {len(ops) + 1}, "
                                   f"found {' '.join(toks[i:i + 3])!r}")
            key, value = toks[i], toks[i + 2].strip('"')
            if key in fields:
                raise CompileError(f"{where}: {key} is given twice in aipp_op block {len(ops) + 1}")
            fields[key] = value
            i += 3
        ops.append(_op(fields, f"{where}: aipp_op block {len(ops) + 1}"))
    if not ops:
        raise CompileError(f"{where}: no aipp_op block")
    ranks = [op.related_input_rank for op in ops]
    if len(set(ranks)) != len(ranks):
        raise CompileError(f"{where}: two aipp_op blocks feed input rank {max(ranks, key=ranks.count)} "
                           "(ATC allows one per input)")
    return ops


def _bool(key: str, value: str, where: str) -> bool:
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise CompileError(f"{where}: {key} must be true or false, got {value!r}")


def _number(key: str, value: str, where: str, integer: bool):
    try:
        return plain_number(value, integer)
    except ValueError:
        raise CompileError(f"{where}: {key} must be {'an integer' if integer else 'a number'}, got {value!r}") from None


def _op(fields: dict[str, str], where: str) -> AippOp:
    mode = fields.pop("aipp_mode", None)
    if mode is None:
        raise CompileError(f"{where}: aipp_mode is required (aclserve supports static)")
    if mode == "dynamic":
        raise CompileError(f"{where}: dynamic AIPP is not supported by aclserve (use aipp_mode: static)")
    if mode != "static":
        raise CompileError(f"{where}: aipp_mode must be static, got {mode!r}")
    kw: dict = {}
    channel_values = {"mean_chn": [0, 0, 0, 0], "min_chn": [0.0] * 4, "var_reci_chn": [1.0] * 4}
    for key, value in fields.items():
        m = _CHANNEL_KEY.match(key)
        if key == "input_format":
            if value in _REFUSED_FORMATS:
                raise CompileError(f"{where}: input_format {value} is not supported by aclserve "
                                   f"(supported: {', '.join(CHANNELS)}; no YUV420SP/XRGB input)")
            if value not in CHANNELS:
                raise CompileError(f"{where}: unknown input_format {value!r} (supported: {', '.join(CHANNELS)})")
            kw[key] = value
        elif key in _INT_RANGES:
            lo, hi = _INT_RANGES[key]
            n = _number(key, value, where, True)
            if not lo <= n <= hi:
                raise CompileError(f"{where}: {key} must be in [{lo}, {hi}], got {n}")
            kw[key] = n
        elif key in _BOOLS:
            kw[key] = _bool(key, value, where)
        elif key == "padding_value":  # in the AIPP output's type, fp16 here (the model input is float)
            n = _number(key, value, where, False)
            if not -FP16_MAX <= n <= FP16_MAX:
                raise CompileError(f"{where}: {key} must be in [-65504, 65504] (an fp16, the AIPP output's type), "
                                   f"got {n}")
            kw[key] = n
        elif m:
            kind, c = m.group(1), int(m.group(2))
            n = _number(key, value, where, kind == "mean_chn")
            if kind == "mean_chn" and not 0 <= n <= 255:
                raise CompileError(f"{where}: {key} must be in [0, 255], got {n}")
            if kind == "min_chn" and not 0 <= n <= 255:
                raise CompileError(f"{where}: {key} must be in [0, 255], got {n}")
            if kind == "var_reci_chn" and not -FP16_MAX <= n <= FP16_MAX:
                raise CompileError(f"{where}: {key} must be in [-65504, 65504], got {n}")
            channel_values[kind][c] = n
        elif key == "related_input_name":
            raise CompileError(f"{where}: related_input_name is for Caffe models; use related_input_rank")
        elif key == "max_src_image_size":
            raise CompileError(f"{where}: max_src_image_size belongs to dynamic AIPP, which is not supported")
        elif key in ("resize_output_w", "resize_output_h") or _CSC_ONLY.match(key):
            continue  # only read with resize/csc_switch, both refused below when switched on
        else:
            raise CompileError(f"{where}: unknown key {key!r}")
    if kw.pop("csc_switch", False):
        raise CompileError(f"{where}: csc_switch (colour-space conversion, YUV input) is not supported by aclserve")
    if kw.pop("resize", False):
        raise CompileError(f"{where}: resize is reserved by ATC and not supported; resize on the host")
    if kw.pop("ax_swap_switch", False):
        raise CompileError(f"{where}: ax_swap_switch applies to XRGB/ARGB input, which is not supported")
    return AippOp(**kw, **{k: tuple(v) for k, v in channel_values.items()})


# ---- the common case: generated from flags -------------------------------------------------

def _floats(text: str, what: str) -> list[float]:
    try:
        values = [plain_number(v.strip()) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):  # float() takes nan and inf
        raise CompileError(f"--{what} must be comma-separated finite numbers, got {text!r}")
    return values


def unit_scale_warning(mean, std) -> str | None:
    """What to say when every mean and std value is below 1: torchvision's units (for pixels
    scaled to 0-1) given where pixel units are expected (mean 0.485, std 0.229 make a white pixel
    1,111, not 2.2); else None. For compile's --mean/--std and image inputs' (images/plan.py)."""
    if not std or max(abs(v) for v in std) >= 1 or (mean and max(abs(v) for v in mean) >= 1):
        return None
    return ("mean and std are all below 1, as for pixels scaled to 0-1 (torchvision's Normalize), but they are in "
            "pixel units, 0-255: multiply them by 255 (ImageNet's: mean 123.675,116.28,103.53, std "
            "58.395,57.12,57.375)")


def generate(colour: str, mean: str | None = None, std: str | None = None, rank: int = 0) -> AippOp:
    """`--image-input rgb|bgr|gray --mean M,.. --std S,..` (pixel units, 0-255): host sends
    uint8 pixels in that order (any case); the OM computes (pixel - mean) / std per channel, after
    the R/B swap of bgr (ATC's AIPP order), so mean and std are R,G,B for bgr too."""
    if colour.lower() not in ("rgb", "bgr", "gray"):
        raise CompileError(f"--image-input must be rgb, bgr or gray, got {colour!r}")
    colour = colour.lower()
    channels = 1 if colour == "gray" else 3
    means = _floats(mean, "mean") if mean else [0.0] * channels
    stds = _floats(std, "std") if std else [1.0] * channels
    for values, what in ((means, "mean"), (stds, "std")):
        if len(values) == 1:
            values *= channels
        if len(values) != channels:
            raise CompileError(f"--{what} needs {channels} value(s) for --image-input {colour}, got {len(values)}")
    if any(not 0 <= m <= 255 for m in means):
        raise CompileError("--mean values must be in [0, 255] (pixel units)")
    if any(not s or abs(1 / s) > FP16_MAX for s in stds):  # the OM multiplies by 1/std, an FP16
        raise CompileError(f"--std values must be at least 1/{FP16_MAX:g} (about 1.53e-5) in size, the "
                           f"reciprocal being an FP16 (pixel units, e.g. 58.395); got {std!r}")
    pad = [0.0] * (4 - channels)
    return AippOp(related_input_rank=rank, input_format="YUV400_U8" if colour == "gray" else "RGB888_U8",
                  rbuv_swap_switch=colour == "bgr", mean_chn=(0, 0, 0, 0), min_chn=tuple(means + pad),
                  var_reci_chn=tuple([1.0 / s for s in stds] + [1.0] * (4 - channels)))


def render(ops: list[AippOp]) -> str:
    """ATC config text for `ops` (what aclserve hands ATC: exactly what the CPU OM emulates)."""
    blocks = []
    for op in ops:
        lines = ["aipp_op {", "  aipp_mode: static"]
        defaults = AippOp()
        for key, value in asdict(op).items():
            if key in ("mean_chn", "min_chn", "var_reci_chn"):
                for c in range(op.channels):
                    lines.append(f"  {key}_{c}: {_fmt(value[c])}")
            elif key in ("related_input_rank", "input_format") or value != getattr(defaults, key):
                lines.append(f"  {key}: {_fmt(value)}")
        lines.append("}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks) + "\n"


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# ---- checking against the model -------------------------------------------------------------

# The widest AIPP output with padding: 1080 on Atlas inference (Ascend310P*) and Atlas training
# (Ascend910, 910A/B, 910ProA/B, 910PremiumA; not the A2 Ascend910B1..) and the Ascend310, 4096 on
# the others (200I/500 A2, A2, A3, 950) (config_file_template.md; TBE aipp_comm.py raises "after
# padding, aipp output W[%d] should be less than or eaqual to 1080" on Ascend310/610/710).
_PADDED_W_1080 = (SocFamily.ATLAS_200_300_500, SocFamily.ATLAS_INFERENCE, SocFamily.ATLAS_TRAINING)
PADDED_W_MAX = 4096


def bind(ops: list[AippOp], spec: ModelSpec, soc_version: str | None = None) -> list[BoundAipp]:
    """Check each op against the input it feeds (4-d NCHW float, C and H x W consistent) and,
    with padding, the output width the SoC takes (`soc_version` None: the limit of every SoC)."""
    bound = []
    for op in ops:
        if op.related_input_rank >= len(spec.inputs):
            raise CompileError(f"AIPP related_input_rank {op.related_input_rank} but the model has "
                               f"{len(spec.inputs)} input(s)")
        t = spec.inputs[op.related_input_rank]
        if len(t.dims) != 4:
            raise CompileError(f"AIPP needs a 4-d NCHW image input; input {t.name!r} has dims {t.dims}")
        if t.dtype.kind != "f":
            raise CompileError(f"AIPP feeds a float input; input {t.name!r} is {t.dtype}")
        _, c, h, w = t.dims
        if c != op.channels:
            raise CompileError(f"AIPP input_format {op.input_format} gives {op.channels} channel(s); "
                               f"input {t.name!r} (NCHW {t.dims}) has {c}")
        if op.padding:
            limit = 1080 if soc_family(soc_version) in _PADDED_W_1080 else PADDED_W_MAX
            if w > limit:
                raise CompileError(f"AIPP for {t.name!r}: with padding the AIPP output W must be at most {limit}"
                                   f"{' on ' + soc_version if limit == 1080 else ''}; the model input is {w} wide")
        bound.append(_geometry(op, t, h, w))
    return bound


def _geometry(op: AippOp, t: TensorInfo, h: int, w: int) -> BoundAipp:
    pad_h = op.top_padding_size + op.bottom_padding_size if op.padding else 0
    pad_w = op.left_padding_size + op.right_padding_size if op.padding else 0
    name = t.name
    if (op.src_image_size_w == 0 or op.src_image_size_h == 0) and (op.crop or op.padding):
        raise CompileError(f"AIPP for {name!r}: src_image_size_w/h may be 0 (the model's size) only "
                           "without crop and padding")
    # 0 takes the model's own W x H, which must then be in ATC's ranges: W [2, 4096], H [1, 4096]
    if op.src_image_size_w == 0 and not 2 <= w <= 4096:
        raise CompileError(f"AIPP for {name!r}: src_image_size_w 0 takes the model's W {w}, which must be in [2, 4096]")
    if op.src_image_size_h == 0 and not 1 <= h <= 4096:
        raise CompileError(f"AIPP for {name!r}: src_image_size_h 0 takes the model's H {h}, which must be in [1, 4096]")
    src_h, src_w = op.src_image_size_h or h, op.src_image_size_w or w
    if src_w < 2:
        raise CompileError(f"AIPP for {name!r}: src_image_size_w must be at least 2")
    box = None
    out_h, out_w = src_h, src_w
    if op.crop:
        ch = op.crop_size_h or (h if not op.padding else 0)
        cw = op.crop_size_w or (w if not op.padding else 0)
        if not ch or not cw:
            raise CompileError(f"AIPP for {name!r}: crop_size_w/h may be 0 only without padding")
        if op.load_start_pos_h + ch > src_h or op.load_start_pos_w + cw > src_w:
            raise CompileError(f"AIPP for {name!r}: crop {cw}x{ch} at ({op.load_start_pos_w}, "
                               f"{op.load_start_pos_h}) leaves the {src_w}x{src_h} source image")
        box = (op.load_start_pos_h, op.load_start_pos_w, ch, cw)
        out_h, out_w = ch, cw
    if (out_h + pad_h, out_w + pad_w) != (h, w):
        raise CompileError(f"AIPP for {name!r} produces {out_w + pad_w}x{out_h + pad_h} (W x H after crop and "
                           f"padding) but the model input is {w}x{h}")
    return BoundAipp(op, t, src_h, src_w, box)
