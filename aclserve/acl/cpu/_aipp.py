"""What acl.mdl.get_first_aipp_info reports on the CPU runtime: the static AIPP a CPU OM's
header records.

pyACL returns (dict, 0), the dict keyed like aclAippInfo, or (None, ret): 145015
(ACL_ERROR_GE_AIPP_NOT_EXIST) for an input without static AIPP. The dict holds the fields a
static AIPP config sets; the dynamic-AIPP fields (srcFormat, srcDatatype, srcDimNum, shapeCount,
outDims), the colour-space matrix and biases and aippExtend are left out: aclserve compiles
neither CSC nor dynamic AIPP, and no caller here reads them.
"""
from __future__ import annotations

import struct

from .. import constants as C

_INPUT_FORMATS = {"RGB888_U8": C.ACL_RGB888_U8, "YUV400_U8": C.ACL_YUV400_U8}


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
    for field, key, fill in (("mean_chn", "meanChn", 0), ("min_chn", "minChn", 0.0), ("var_reci_chn", "varReciChn", 1.0)):
        values = list(op[field]) + [fill] * (4 - len(op[field]))
        cast = int if key == "meanChn" else _c_float  # pyACL builds them from C int / float
        info.update({f"{key}{c}": cast(values[c]) for c in range(4)})
    return info


def _c_float(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]
