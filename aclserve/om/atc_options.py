"""What ATC takes of the options a compile records, so that a CPU OM is not built from what ATC
would refuse (an independent tester compiled `--precision-mode bogus`, `--soc-version Bogus123`
and opsets 7 and 28 without a word).

--precision_mode has a documented list of values (ATC's flag help, hicann/ge api/atc; the ATC
page "--precision_mode"): any other is refused on both targets. The SoCs and opsets ATC takes
depend on the CANN installed (an OPP per SoC; ONNX opsets 11 in CANN 5.0/6.0, 11-15 in 8.0, 11-18
in the newest), so a CPU compile is warned, not refused: ATC itself judges them on the NPU path.
"""
from __future__ import annotations

import re

import onnx

from .spec import CompileError

PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16", "must_keep_origin_dtype",
                   "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16")
OPSETS = (11, 18)  # the newest CANN's ONNX opsets, both ends included
# `Ascend` + the chip's name from npu-smi (Ascend310, Ascend310P3, Ascend310B1, Ascend910B3, ...)
_SOC_NAME = re.compile(r"^Ascend[0-9]{3}[0-9A-Za-z_-]*$")


def check_precision_mode(mode: str | None) -> None:
    """Refuse a precision mode that is none of ATC's (None: ATC's default, force_fp16)."""
    if mode is not None and mode not in PRECISION_MODES:
        raise CompileError(f"--precision-mode {mode!r} is not one ATC takes: {', '.join(PRECISION_MODES)}")


def cpu_warnings(model: onnx.ModelProto, soc_version: str | None) -> list[str]:
    """What ATC would refuse (or may) among what a CPU compile records: its SoC and the model's
    ONNX opset. One line each, for the compile's summary."""
    warnings = []
    if soc_version is not None and not _SOC_NAME.match(soc_version):
        warnings.append(f"--soc-version {soc_version!r} does not look like a SoC ATC takes (`Ascend` and the "
                        "chip's name from npu-smi, e.g. Ascend310P3, Ascend910B1): ATC would refuse it")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and not OPSETS[0] <= opset <= OPSETS[1]:
        warnings.append(f"the model imports ONNX opset {opset}; ATC takes opsets {OPSETS[0]} to {OPSETS[1]} (older "
                        "CANN fewer: 8.0 takes 11 to 15): ATC would refuse it; convert it (onnx.version_converter)")
    return warnings
