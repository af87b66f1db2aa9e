"""What an .om file says about itself, as a dict (for --json) and as readable text.

Used by `aclserve inspect` and by the summary `aclserve compile` prints. Reads headers, and a
CPU OM's payload for its checksum.
"""
from __future__ import annotations

import os

from . import atc_om, container
from .container import OmFormatError
from .dims_names import dims_stand_in, fits_dims

NEEDS_CANN = "built by ATC for an Ascend NPU: loading it needs CANN and an NPU (the CPU runtime refuses it)"


class InspectError(ValueError):
    """The file is missing or is not an OM; the message is one line."""


def describe(path: str | os.PathLike) -> dict:
    """{"path", "size", "kind": "cpu_om"|"atc_om"|"om2", "header": {...}, "note"?}."""
    path = os.fspath(path)
    if not path:
        raise InspectError("no OM file given (an empty path)")
    if not os.path.exists(path):
        raise InspectError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InspectError(f"{path}: is a directory, not an OM file")
    try:
        kind, header = atc_om.identify(path)  # refuses a FIFO, socket or device node unopened
        if kind == "cpu_om":  # a corrupt payload: what serve refuses, inspect says too
            container.verify_payload_file(path, header)
    except OmFormatError as e:
        raise InspectError(f"{path}: {e}{atc_om.compile_hint(path)}") from None
    except OSError as e:
        raise InspectError(f"{path}: {e.strerror or e}") from None
    info = {"path": path, "size": os.path.getsize(path), "kind": kind}
    if kind == "cpu_om":
        info["header"] = header
        info["note"] = "CPU OM: loads on the aclserve CPU runtime (not on an NPU)"
    elif kind == "atc_om":
        info["header"] = header.as_dict()
        info["note"] = NEEDS_CANN
    else:
        info["header"] = {}
        info["note"] = "OM2 (ZIP) archive from a recent ATC: needs CANN to load; no further details read"
    return info


def _shape(dims) -> str:
    return "[" + ",".join("N" if d == -1 else str(d) for d in dims) + "]"


def tensor_lines(header: dict) -> list[str]:
    lines = []
    for role in ("inputs", "outputs"):
        if role not in header:
            continue
        tensors = header[role]
        lines.append(f"{role} ({len(tensors)}):")
        for index, t in enumerate(tensors):
            extra = "  (dynamic-batch input, filled by set_dynamic_batch_size)" if t.get("dynamic_batch") else ""
            extra += _reported(t, role == "outputs", index)
            lines.append(f"  {t.get('name')}: {t.get('datatype')} {_shape(t.get('dims', []))} "
                         f"{t.get('format', '')}{extra}")
    gears = header.get("gears") or []
    lines.append("gears: " + (",".join(map(str, gears)) + " (N = batch size)" if gears else "none (static batch)"))
    return lines + aipp_lines(header)


def _reported(tensor: dict, outputs: bool, index: int) -> str:
    """What the device names the tensor, where clients know it otherwise: get_*_name_by_index the
    ATC name of an output, get_*_dims a stand-in for a name over 127 bytes (dims_names.py)."""
    reported = tensor.get("atc_name") or tensor.get("name") or ""
    by_name = f"{reported} by name" if reported != tensor.get("name") else ""
    if fits_dims(reported):
        return f"  (the device reports {reported})" if by_name else ""
    in_dims = (f"{dims_stand_in('<model id>', outputs, index)} in get_{'output' if outputs else 'input'}_dims, "
               "the name being over 127 bytes")
    return f"  (the device reports {by_name + ', and ' if by_name else ''}{in_dims})"


def aipp_lines(header: dict) -> list[str]:
    """The static AIPP settings compiled in (from the header aclserve wrote)."""
    lines = []
    for a in header.get("aipp") or []:
        if a["input_format"] == "YUV400_U8":
            order = "grey"  # (its one channel has no R and B to swap, whatever rbuv_swap_switch says)
        else:
            order = "BGR" if a.get("rbuv_swap_switch") else "RGB"
        lines.append(f"aipp on {a['input']}: static, {a['input_format']} ({order}), source "
                     f"{a['image_input']['dims'][2]}x{a['image_input']['dims'][1]} uint8 NHWC -> "
                     f"{a['model_input']['datatype']} NCHW {_shape(a['model_input']['dims'])}")
        lines.append(f"  normalise: (pixel - mean_chn - min_chn) * var_reci_chn with mean_chn {a['mean_chn']}, "
                     f"min_chn {a['min_chn']}, var_reci_chn {a['var_reci_chn']}")
        if a.get("crop"):
            lines.append(f"  crop: {a['crop_size_w']}x{a['crop_size_h']} at ({a['load_start_pos_w']}, "
                         f"{a['load_start_pos_h']})")
        if a.get("padding"):
            lines.append(f"  padding: left {a['left_padding_size']}, right {a['right_padding_size']}, top "
                         f"{a['top_padding_size']}, bottom {a['bottom_padding_size']}, value {a['padding_value']:g}")
    return lines


def format_text(info: dict) -> str:
    h = info["header"]
    lines = [f"{info['path']}: {info['kind']} ({_size(info['size'])})", info["note"]]
    if info["kind"] == "cpu_om":
        lines += [f"name: {h.get('name')}", f"producer: {h.get('producer')}", f"created: {h.get('created')}"]
        src = h.get("source") or {}
        lines.append(f"source: {src.get('path')} (sha256 {src.get('sha256')})")
        lines += tensor_lines(h)
        for key, value in sorted((h.get("options") or {}).items()):
            lines.append(f"option {key}: {value}")
        lines.append(f"payload sha256: {h.get('payload_sha256')}")
        known = {"name", "producer", "created", "source", "inputs", "outputs", "gears", "options", "payload_sha256",
                 "aipp"}
        for key in sorted(set(h) - known):
            lines.append(f"{key}: {h[key]}")
    elif info["kind"] == "atc_om":
        lines += [f"name: {h['name']}", f"header version: {h['version']:#x}", f"model type: {h['model_type']}",
                  f"encrypted: {'yes' if h['is_encrypt'] else 'no'}",
                  f"dynamic shape: {'yes' if h['is_dynamic'] else 'no'}"
                  + (" (acl.mdl.query_size refuses fully dynamic-shape OMs: aclserve loads it with "
                     "load_from_file, so CANN allocates its memory, without huge-page control)"
                     if h["is_dynamic"] else ""),
                  f"platform version: {h['platform_version'] or '(not set)'}",
                  f"generated: {h['gen_mode']}, ops: {h['ops']}, om_ir_version: {h['om_ir_version']}",
                  f"payload: {_size(h['model_length'] or h['length'])}",
                  "aipp: not in the 256-byte header (on an NPU, acl.mdl.get_first_aipp_info reports it; "
                  "`aclserve compile` prints what it passed to ATC)"]
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# What each ATC precision mode does to an FP32 model's operators on an NPU (ATC's --precision_mode
# page); must_keep_origin_dtype keeps its types, as the CPU runtime does
LOWERED_ON_NPU = {
    "force_fp16": "every operator that has an fp16 kernel in fp16",
    "allow_fp32_to_fp16": "matrix operators (MatMul, Conv) in fp16",
    "force_fp32": "matrix operators on fp16 inputs", "cube_fp16in_fp32out": "matrix operators on fp16 inputs",
    "allow_mix_precision": "some operators in fp16", "allow_mix_precision_fp16": "some operators in fp16",
    "allow_mix_precision_bf16": "some operators in bf16", "allow_fp32_to_bf16": "matrix operators in bf16",
}


def precision_note(header: dict, fp32_operators: bool = True, float_operators: bool = True) -> list[str]:
    """A CPU OM records its precision mode for ATC; the CPU runtime computes in the model's own
    types whatever it says, so answers there can be finite where a device's overflow fp16.
    `fp32_operators`: whether the model has operators computing in FP32, which the note names;
    `float_operators`: in floating point at all (an INT32 model's do not: its note said that answers
    may differ, while a precision mode changes none of its types)."""
    mode = (header.get("options") or {}).get("precision_mode")
    lowered = LOWERED_ON_NPU.get(mode)
    if lowered is None:
        return []
    if not float_operators:
        return [f"note: precision_mode {mode} is recorded for ATC, not applied: the model has no floating-point "
                "tensors (integers or booleans only), the only ones a precision mode acts on, so it changes none "
                "of the model's types on an NPU either"]
    # (fp16's range ends at 65504, which an FP16 model meets on the CPU runtime too; bf16 keeps fp32's range)
    overflow = " (past 65504, fp16's largest: inf)" if "fp16" in lowered and fp32_operators else ""
    fp32 = " (its FP32 operators in fp32)" if fp32_operators else ""  # (none in an INT32 model)
    return [f"note: precision_mode {mode} is recorded for ATC, not applied: the CPU runtime computes in the "
            f"model's own types{fp32}; on an NPU {mode} runs {lowered}, so answers may differ{overflow}; "
            "--precision-mode must_keep_origin_dtype keeps the model's types there too"]


def format_summary(result) -> str:
    """The lines `aclserve compile` prints after a build (result: compile.CompileResult)."""
    h = result.header
    lines = [f"wrote {result.path} ({'ATC OM' if result.target == 'npu' else 'CPU OM'}, "
             f"{_size(result.size)}) in {result.seconds:.2f} s"]
    lines += tensor_lines(h)
    if result.target == "npu":
        lines.append(NEEDS_CANN)
    else:
        lines += precision_note(h, result.fp32_operators, result.float_operators)
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines)
