"""What acl.mdl.get_first_aipp_info reports on the CPU runtime: the static AIPP a CPU OM's
header records; and what acl.mdl.get_input_dims_v2 reports for its input.

pyACL returns (dict, 0), the dict keyed like aclAippInfo, or (None, ret): 145015
(ACL_ERROR_GE_AIPP_NOT_EXIST) for an input without static AIPP. The dict holds the fields a
static AIPP config sets; the dynamic-AIPP fields (srcFormat, srcDatatype, srcDimNum, shapeCount,
outDims), the colour-space matrix and biases and aippExtend are left out: aclserve compiles
neither CSC nor dynamic AIPP, and no caller here reads them.
"""
from __future__ import annotations

import struct

from ...om.cpu_header import AIPP_INPUT_FORMATS
from .. import constants as C

# the formats a CPU OM may declare and their buffers' layouts: the header checker's table, so what
# the header check lets through the runtime can report dims for
_INPUT_FORMATS = {name: code for code, name in C.AIPP_FORMAT_NAMES.items() if name in AIPP_INPUT_FORMATS}


def aipp_info(op: dict) -> dict:
    """The aclAippInfo dict of one AIPP entry of a CPU OM's header (the compile's summary);
    KeyError, TypeError or ValueError for an entry that is not one (the header is refused).
    Built when the header is read, so the call itself never fails on it."""
    _, height, width, _ = op["image_input"]["dims"]
    info = {"inputFormat": _INPUT_FORMATS[op["input_format"]], "srcImageSizeW": width, "srcImageSizeH": height,
            "cropSwitch": int(op["crop"]), "loadStartPosW": op["load_start_pos_w"],
            "loadStartPosH": op["load_start_pos_h"], "cropSizeW": op["crop_size_w"], "cropSizeH": op["crop_size_h"],
            "resizeSwitch": 0, "resizeOutputW": 0, "resizeOutputH": 0, "paddingSwitch": int(op["padding"]),
            "leftPaddingSize": op["left_padding_size"], "rightPaddingSize": op["right_padding_size"],
            "topPaddingSize": op["top_padding_size"], "bottomPaddingSize": op["bottom_padding_size"],
            "cscSwitch": 0, "rbuvSwapSwitch": int(op["rbuv_swap_switch"]), "axSwapSwitch": 0, "singleLineMode": 0}
    for field, key, fill in (("mean_chn", "meanChn", 0), ("min_chn", "minChn", 0.0),
                             ("var_reci_chn", "varReciChn", 1.0)):
        values = list(op[field]) + [fill] * (4 - len(op[field]))
        cast = int if key == "meanChn" else _c_float  # pyACL builds them from C int / float
        info.update({f"{key}{c}": cast(values[c]) for c in range(4)})
    return info


def _c_float(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def dims_v2(input_format: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    """get_input_dims_v2's dims of an input of NHWC `dims` behind a static AIPP of `input_format`;
    KeyError for a format the table has no row for, ValueError for dims it cannot take."""
    (num, den), channels = AIPP_INPUT_FORMATS[input_format]
    n, height, width, _ = dims
    if height * num % den:
        raise ValueError(f"AIPP input format {input_format} takes an even height, not {height}")
    return n, height * num // den, width, channels
