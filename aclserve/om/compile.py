"""compile_model(): ONNX -> .om, with ATC when it is available (or asked for), else a CPU OM.

This is the Python API behind `aclserve compile`; the model repository calls it to compile a
dropped .onnx. It blocks the calling thread for the whole build (seconds on the CPU path,
minutes under ATC) and raises CompileError (one-line message) for bad input or a failed build.
Importing it has no side effects.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import aipp as aipp_mod
from . import aipp_onnx
from . import atc as atc_mod
from . import atc_options, batch_rows, container, cpu_compile, data_sized, names
from .compile_error import ATC_NOT_ON_PATH, DEFAULT_TIMEOUT_S, check_timeout
from .index_bounds import index_bounds
from ..regular_files import open_regular
from .declared_dims import fill_declared
from .shape_args import check_precision_mode, parse_gears, parse_input_shape
from .spec import CompileError, graph_inputs, load_onnx, resolve
from .training_dropout import refuse_training_dropout
from ..dtypes import numpy_to_kserve
from ..value_ranges import table_range

TARGETS = ("auto", "npu", "cpu")
DEFAULT_PRECISION_MODE = "force_fp16"

__all__ = ["CompileError", "CompileResult", "compile_model", "TARGETS"]


@dataclass
class CompileResult:
    path: Path
    target: str  # "npu" (built by ATC) or "cpu" (CPU OM)
    header: dict  # the CPU OM header, or the ATC OM's 256-byte header facts
    seconds: float
    size: int  # bytes on disk
    # integer inputs indexing a table of the model: {name: entries} (index_bounds.py); the
    # server refuses values outside [0, entries)
    index_bounds: dict = field(default_factory=dict)
    # what ATC would refuse among what a CPU OM records (atc_options.cpu_warnings), and what its test
    # runs found that serving it needs (cpu_compile.probe_outputs: warmup_data), one line each
    warnings: list = field(default_factory=list)
    # whether an operator of the model computes in FP32, which a precision mode lowers on an NPU and the CPU
    # runtime does not, or in floating point at all (atc_options.floating_point_types; the summary's
    # precision note says so: an INT32 model's, that the mode changes none of its types)
    fp32_operators: bool = True
    float_operators: bool = True


def default_output(onnx_path: str | os.PathLike) -> Path:
    """model.onnx -> model.om beside it."""
    p = Path(onnx_path)
    return p.with_suffix(".om") if p.suffix.lower() == ".onnx" else p.with_name(p.name + ".om")


def compile_model(onnx_path: str | os.PathLike, output: str | os.PathLike | None = None, *,
                  input_shape: str | dict | None = None, batch: str | list[int] | None = None,
                  soc_version: str | None = None, precision_mode: str | None = DEFAULT_PRECISION_MODE,
                  target: str = "auto", atc: str | os.PathLike | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S, aipp: list[aipp_mod.AippOp] | None = None,
                  declared_dims: dict | None = None, batch_optional: bool = False,
                  log: Callable[[str], None] = print, log_start: bool = True) -> CompileResult:
    """Compile `onnx_path` to `output` (default: beside it with .om) and return what was built.

    input_shape: "name:-1,3,224,224;name2:..." or {name: dims}; batch: "1,2,4" or [1, 2, 4]
    (default 1,2,4,8,16,32 when the model has a dynamic batch dimension; one size compiles a
    static batch of that size, as ATC takes 2 to 100 dynamic sizes; batch_optional: a model without
    a batch dimension compiles without them, not refused: model_defaults' sizes). soc_version: required when
    ATC builds (`aclserve compile` reads it from the NPU when there is one). target "auto" uses
    ATC when `atc` is given or `atc` is on PATH, "npu" requires ATC, "cpu" writes a CPU OM.
    aipp: static AIPP ops (aipp.parse / aipp.generate): ATC gets them as --insert_op_conf, the
    CPU OM gets the same arithmetic as ONNX operations in front of the graph. declared_dims: {input:
    dims} a config declares (a config.pbtxt's), which size the dimensions the model leaves variable
    but its batch dimension, for inputs input_shape does not name (declared_dims.py).
    The output appears atomically (temporary file, then rename) or not at all.
    log_start: whether `log` hears the line saying the compile begins (`compiling model.onnx
    ...`); the server says its own, naming the cache entry.
    """
    start = time.monotonic()
    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    check_timeout(timeout)
    precision_mode = check_precision_mode(precision_mode)
    shapes = input_shape if isinstance(input_shape, dict) else parse_input_shape(input_shape)
    gears = parse_gears(batch)
    atc_path = None
    if target in ("auto", "npu"):
        atc_path = atc_mod.find_atc(atc)
        if atc_path is None and target == "npu":
            raise CompileError(f"{ATC_NOT_ON_PATH} (install CANN's toolkit or pass --atc PATH)")
    elif atc is not None:
        raise CompileError("--atc given with --target cpu; drop one of them")

    src = os.fspath(onnx_path)
    if not src:  # Path('') is '.': the default output below had no name to take (a traceback)
        raise CompileError("no model file given (an empty path)")
    if not os.path.exists(src):  # (before the output's checks: the default output's folder is the model's)
        raise CompileError(f"{src}: no such file")
    out = Path(output) if output is not None else default_output(src)
    if out.suffix != ".om":
        raise CompileError(f"output {out} must end with .om")
    if not out.parent.is_dir():  # (a file there was said not to exist)
        what = "is a file, not a folder" if out.parent.exists() else "does not exist"
        raise CompileError(f"output folder {out.parent} {what}")
    if out.is_dir():  # (said before the compile, not after it: ATC may take minutes)
        raise CompileError(f"cannot write {out}: it is a folder")
    if _same_file(src, out):  # (an ONNX model named w.om, compiled to w.om, was written over)
        raise CompileError(f"output {out} is the model file {src} itself: the compile would write over its "
                           "source; name another output")
    if atc_path is not None:  # (before the model's checks, which run it: compile_with_atc says it again)
        atc_mod.atc_output_name(out)
    model = load_onnx(src, weights=atc_path is None)  # (ATC reads the weights from the model's path)
    refuse_training_dropout(model)  # (random at every run: no input shape or batch size serves it)
    fill_declared(graph_inputs(model), declared_dims or {}, shapes)
    spec = resolve(model, {k: list(v) for k, v in shapes.items()}, gears, batch_optional)
    names.refuse_misread(model)  # (an output the server would find under another name)
    bounds = index_bounds(model.graph)
    input_types = {t.name: t.dtype for t in spec.inputs}  # (before AIPP puts pictures in front)
    bound = aipp_mod.bind(aipp, spec, soc_version) if aipp else []
    aipp_header = {"aipp": [b.summary() for b in bound]} if bound else {}
    warnings, fp32_operators, float_operators = list(spec.warnings), True, True

    if atc_path is not None:
        if not soc_version:
            raise CompileError("ATC needs the SoC to build for and there is no Ascend device here to read it "
                               "from: pass --soc-version (e.g. Ascend310P3, Ascend910B1)")
        data_sized.check_source(spec)  # (before ATC's minutes, as the CPU compile's output_types)
        # (operators outside the ONNX domain are ATC's to judge: a custom op plugin on this host may parse them)
        if spec.dynamic_batch:  # (before ATC's minutes: the CPU compile finds it in its test runs)
            batch_rows.check_source(src, spec)
        if log_start:
            log(f"compiling {src} with ATC ({atc_path}) for {soc_version}")
        hdr = atc_mod.compile_with_atc(atc_path, src, out, spec, soc_version=soc_version,
                                       precision_mode=precision_mode, timeout=timeout, log=log,
                                       insert_op_conf=aipp_mod.render(aipp) if bound else None)
        image = {b.input.name: b.image_dims for b in bound}
        inputs = [dict(t.header_entry(is_input=True), **({"datatype": "UINT8", "dims": image[t.name], "format": "NHWC"}
                                            if t.name in image else {})) for t in spec.inputs]
        header = dict(hdr.as_dict(), gears=list(spec.gears), inputs=inputs, **aipp_header)
        kind = "npu"
    else:
        atc_options.refuse_foreign_operators(model)  # (the source's: ONNX Runtime's optimiser adds its own)
        if log_start:
            log(f"compiling {src} for the CPU runtime (ATC not used)")
        warnings += atc_options.cpu_warnings(model, soc_version)
        floats = atc_options.floating_point_types(model)  # (the model's own: AIPP's operators go in front)
        fp32_operators, float_operators = atc_options.FP32 in floats, bool(floats)
        with open_regular(src) as f:
            source_bytes = f.read()
        options = {k: v for k, v in (("input_shape", spec.atc_input_shape()), ("soc_version", soc_version),
                                     ("precision_mode", precision_mode)) if v is not None}
        if bound:
            spec = aipp_onnx.apply(spec, bound)
        header, payload, found = cpu_compile.build(spec, name=out.stem, source_path=src,
                                                   source_bytes=source_bytes, options=options)
        warnings += found
        header.update(aipp_header)
        container.write(out, header, payload)
        header = container.read_header(out)
        kind = "cpu"
    for name, entries in bounds.items():  # (the server's compile keeps them; an .om served later needs its YAML)
        log(_range_line(name, entries, input_types[name]))
    return CompileResult(out, kind, header, time.monotonic() - start, out.stat().st_size, bounds, warnings,
                         fp32_operators, float_operators)


def _same_file(src: str, out: Path) -> bool:
    """Whether `out` is `src` (the same path, or a link to the same file)."""
    try:
        return out.exists() and os.path.samefile(src, out)
    except OSError:  # (the model missing: load_onnx says so)
        return False


def _range_line(name: str, entries: int, dtype) -> str:
    """What an input indexing a table of `entries` takes, as the load will check it: no more than
    its type holds (999 printed for a UINT8 input, copied into an .om's YAML, failed that load)."""
    low, high = table_range(entries, dtype)
    clipped = ""
    if high < entries - 1:
        clipped = f", the table's 0..{entries - 1} clipped to what {numpy_to_kserve(dtype)} holds"
    return f"input {name} indexes a table of the model: it takes {low}..{high}{clipped} (value_range: [{low}, {high}])"
