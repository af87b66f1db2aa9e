"""The one reader of a CPU OM's JSON header: `aclserve inspect`, the repository's file check and
the CPU runtime's loader all take the header through `check`, so what inspect says loads is what
the loader accepts, and a malformed header is refused with one message naming the field.

`header_sha256` (written since the checksum was added: container.encode) is the sha256 of the
header's canonical JSON without that key; a header carrying it is refused when it does not match.
Headers written before it have none and are read as before (their fields are still checked).
"""
from __future__ import annotations

import hashlib
import json

from ..dtypes import acl_to_kserve, kserve_to_acl

CHECKSUM_KEY = "header_sha256"
DYNAMIC_BATCH_INPUT = "ascend_mbatch_shape_data"  # the input ATC adds; pyACL's ACL_DYNAMIC_TENSOR_NAME
# what the runtime's get_first_aipp_info reads of each static AIPP entry (acl/cpu/_aipp.py)
_AIPP_KEYS = ("input", "input_format", "image_input", "model_input", "crop", "load_start_pos_w",
              "load_start_pos_h", "crop_size_w", "crop_size_h", "padding", "left_padding_size",
              "right_padding_size", "top_padding_size", "bottom_padding_size", "rbuv_swap_switch",
              "mean_chn", "min_chn", "var_reci_chn")
# The AIPP input formats a CPU OM may declare, each with its buffer's layout as aclmdlGetInputDimsV2
# reports it for static AIPP (NHWC): (the H factor as a fraction, C), whose product is the size
# get_input_size_by_index reports; the CPU runtime (acl/cpu/_aipp.py) reads this table. YUV420SP halves
# its chroma rows, so it takes an even height. The CPU compiler writes RGB888_U8 and YUV400_U8 only
# (both as the picture's own dims); a header naming another format is a hand-made stand-in for an ATC
# OM taking it (its ONNX graph still takes the picture's dims).
AIPP_INPUT_FORMATS = {"YUV420SP_U8": ((3, 2), 1), "XRGB8888_U8": ((1, 1), 4), "RGB888_U8": ((1, 1), 3),
                      "YUV400_U8": ((1, 1), 1), "ARGB8888_U8": ((1, 1), 4), "YUYV_U8": ((1, 1), 2),
                      "YUV422SP_U8": ((2, 1), 1)}


class HeaderError(ValueError):
    """The header is not one a CPU OM carries; the message names the field."""


def digest(header: dict) -> str:
    """The checksum `header_sha256` records: over the canonical JSON of every other key."""
    body = {k: v for k, v in header.items() if k != CHECKSUM_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check(header) -> dict:
    """The header, checked (and each tensor's `datatype` and `acl_dtype` both filled in, agreeing);
    raises HeaderError naming the first field that is wrong."""
    if not isinstance(header, dict) or "inputs" not in header or "outputs" not in header:
        raise HeaderError("CPU OM header lacks inputs/outputs")
    recorded = header.get(CHECKSUM_KEY)
    if recorded is not None and recorded != digest(header):
        raise HeaderError("CPU OM header checksum mismatch (corrupt file: the header was changed after compile)")
    _expect(isinstance(header.get("name", ""), str), "name", "a string")
    for role in ("inputs", "outputs"):
        _expect(isinstance(header[role], list), role, "a list")
        for i, tensor in enumerate(header[role]):
            _tensor(tensor, f"{role}[{i}]")
    if header["outputs"] == []:
        raise HeaderError("CPU OM header lists no outputs")
    gears = header.get("gears") or []
    _expect(isinstance(gears, list) and all(_int(g) and g > 0 for g in gears), "gears",
            "a list of positive batch sizes")
    dynamic = [t["name"] for t in header["inputs"] if t.get("dynamic_batch") or t["name"] == DYNAMIC_BATCH_INPUT]
    if gears and not dynamic:
        raise HeaderError(f"CPU OM header field gears: batch gears but no {DYNAMIC_BATCH_INPUT} input")
    if dynamic and not gears:
        raise HeaderError(f"CPU OM header field gears: a {DYNAMIC_BATCH_INPUT} input but no gears")
    _expect(isinstance(header.get("payload_sha256", ""), str), "payload_sha256", "a string")
    aipp = header.get("aipp") or []
    _expect(isinstance(aipp, list), "aipp", "a list")
    for i, op in enumerate(aipp):
        _aipp(op, f"aipp[{i}]", len(header["inputs"]))
    return header


def _tensor(tensor, where: str) -> None:
    _expect(isinstance(tensor, dict), where, "an object")
    _expect(isinstance(tensor.get("name"), str) and tensor["name"] != "", f"{where}.name", "a non-empty string")
    _expect(isinstance(tensor.get("atc_name", ""), str), f"{where}.atc_name", "a string")
    datatype, acl_dtype = tensor.get("datatype"), tensor.get("acl_dtype")
    if datatype is None and acl_dtype is None:
        raise HeaderError(f"CPU OM header field {where}.datatype is missing")
    try:
        if acl_dtype is not None:
            _expect(_int(acl_dtype), f"{where}.acl_dtype", "an ACL data type number")
            named = acl_to_kserve(acl_dtype)
        if datatype is not None:
            _expect(isinstance(datatype, str), f"{where}.datatype", "a KServe datatype name")
            number = kserve_to_acl(datatype)
    except ValueError as e:
        raise HeaderError(f"CPU OM header field {where}: {e}") from None
    if datatype is not None and acl_dtype is not None and number != acl_dtype:
        raise HeaderError(f"CPU OM header field {where}.datatype {datatype} disagrees with its acl_dtype "
                          f"{acl_dtype} ({named}): the runtime would run it as {named}")
    tensor["datatype"] = named if datatype is None else datatype
    tensor["acl_dtype"] = number if acl_dtype is None else acl_dtype
    dims = tensor.get("dims")
    _expect(isinstance(dims, list) and all(_int(d) and (d > 0 or d == -1) for d in dims), f"{where}.dims",
            "a list of positive sizes (-1 for the batch)")
    _expect(isinstance(tensor.get("format", "ND"), (str, int)), f"{where}.format", "a format name or number")
    _expect(isinstance(tensor.get("dynamic_batch", False), bool), f"{where}.dynamic_batch", "true or false")
    size = tensor.get("size")
    _expect(size is None or (_int(size) and size > 0), f"{where}.size", "a positive byte count")


def _aipp(op, where: str, input_count: int) -> None:
    _expect(isinstance(op, dict), where, "an object")
    missing = [key for key in ("related_input_rank",) + _AIPP_KEYS if key not in op]
    if missing:
        raise HeaderError(f"CPU OM header field {where}.{missing[0]} is missing")
    rank = op["related_input_rank"]
    _expect(_int(rank) and 0 <= rank < input_count, f"{where}.related_input_rank",
            f"the index of one of its {input_count} inputs")
    formats = tuple(AIPP_INPUT_FORMATS)  # (not `in` the dict: a list there would raise TypeError, not be refused)
    _expect(op["input_format"] in formats, f"{where}.input_format", f"one of {formats}")
    dims = op["image_input"].get("dims") if isinstance(op["image_input"], dict) else None
    _expect(isinstance(dims, list) and len(dims) == 4 and all(_int(d) for d in dims), f"{where}.image_input.dims",
            "four sizes (NHWC)")
    _expect(op["input_format"] != "YUV420SP_U8" or dims[1] % 2 == 0, f"{where}.image_input.dims",
            "of an even height (YUV420SP)")
    for key in ("mean_chn", "min_chn", "var_reci_chn"):
        _expect(isinstance(op[key], list) and len(op[key]) <= 4
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in op[key]),
                f"{where}.{key}", "up to four numbers")


def _int(value) -> bool:
    return type(value) is int


def _expect(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise HeaderError(f"CPU OM header field {field} is not {what}")
