"""What a compile is asked to build: load and check the ONNX model, and resolve every input to a
dtype and fixed dims (-1 only for the batch dimension) from `--input-shape` and `--batch`
(parsed by shape_args.py).

Shared by the CPU path (compile_cpu) and the ATC path (which needs the same `--input_shape`
string, with -1 in the batch dimension). Pure functions; nothing here writes files.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ..dtypes import acl_to_kserve, numpy_to_acl
from ..regular_files import open_regular
from .atc_om import om_kind
from .batch_dims import distinct_batch_symbols, refuse_batch_past_first, rnn_states
from .compile_error import NO_BATCH_DIMENSION, CompileError, NoBatchDimension
from .container import DYNAMIC_BATCH_INPUT
from .cut_short import cut_short
from .external_files import external_bytes, external_locations, link_refusal, missing_external_file
from .gears import DEFAULT_GEARS
from .onnx_types import not_a_tensor
from .open_dims import refuse_open_dims
from .shape_args import MAX_DIM, input_names

BATCH_SYMBOL = "batch"  # the one dim_param every batched input shares, so inference propagates it


@dataclass
class TensorInfo:
    name: str
    dtype: np.dtype
    dims: list[int]  # -1 marks the batch dimension of a dynamic-batch model
    format: str | None = None  # None: see header_entry (AIPP inputs are NHWC)

    def header_entry(self, is_input: bool = False) -> dict:
        """Its entry in a CPU OM's header. Without a format of its own, an input is reported in
        ATC's --input_format, NCHW for ONNX, whatever its rank (ATC's ONNX parser gives every
        Data node that format: UpdateDataFormat); an output NCHW at 4-d, else ND."""
        acl_dtype = numpy_to_acl(self.dtype)
        fmt = self.format or ("NCHW" if is_input or len(self.dims) == 4 else "ND")
        return {"name": self.name, "datatype": acl_to_kserve(acl_dtype), "acl_dtype": acl_dtype,
                "format": fmt, "dims": list(self.dims)}


@dataclass
class ModelSpec:
    """A checked ONNX model with resolved inputs; `model` has its input shapes rewritten."""

    model: onnx.ModelProto = field(repr=False)
    inputs: list[TensorInfo]
    gears: list[int]
    batch_assumed: bool = False  # dimension 0 taken for the batch only as the model leaves it open (resolve)
    # the ONNX model's own inputs (--input-shape's) where AIPP put pictures in front (aipp_onnx); None: inputs
    model_inputs: list[TensorInfo] | None = None
    warnings: list[str] = field(default_factory=list)  # what resolve assumed, one line each (compile.py's)
    exported_batch: int | None = None  # the export's fixed dimension 0 that a -1 in --input-shape opened

    @property
    def dynamic_batch(self) -> bool:
        return bool(self.gears)

    def atc_input_shape(self, batch: str | None = None) -> str:
        """The model's input shapes as --input-shape (and ATC's --input_shape) takes them, the
        first dimension written `batch` when given (a refusal's example: "x:SIZE,3,224,224")."""
        def dims(t: TensorInfo) -> list[str]:
            shown = [str(d) for d in t.dims]
            return [batch] + shown[1:] if batch and shown else shown
        return ";".join(f"{t.name}:{','.join(dims(t))}" for t in self.model_inputs or self.inputs)

    def fixed_dim0_hint(self) -> str:
        """For a refusal of a dynamic-batch model: when its batch was only assumed, the other way
        out, dimension 0 fixed with --input-shape (--batch 1 compiled a one-token model of a
        model whose only open dimension is a sequence's length)."""
        own = self.model_inputs or self.inputs
        return _fixed_dim0_hint([(t.name, t.dims) for t in own]) if self.batch_assumed else ""


MAX_INLINE_BYTES = 2**31 - 1  # protobuf's bound on one message: a model with its weights in it


def load_onnx(path: str | os.PathLike, weights: bool = True) -> onnx.ModelProto:
    """Load and run the ONNX checker; every failure becomes a one-line CompileError. The checker
    runs before the external data is read (a model and its weights over 2 GB are no message it
    takes: refused after every weight was read, 22 s and 6.4 GB for 2.2 GB). `weights` False: the
    external data is checked to be there, not read (ATC reads the model from its path)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CompileError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CompileError(f"{path}: is a directory, not an ONNX file")
    try:
        f = open_regular(path)  # a FIFO, socket or device node is refused unopened
    except OSError as e:
        raise CompileError(f"{path}: {e.strerror or e}") from None
    try:
        with f:
            empty = os.fstat(f.fileno()).st_size == 0  # (it parses: an empty model, "no graph" below)
            model = onnx.load(f, load_external_data=False)  # (the format as for f.name, `path`)
    except Exception as e:  # protobuf DecodeError and friends
        kind = om_kind(path)
        if kind is not None:  # (protobuf's "Error parsing message" did not say what it is)
            raise CompileError(f"{path}: already {kind}, not an ONNX model: nothing to compile; serve it as it is "
                               f"(`aclserve inspect {shlex.quote(path)}` shows what it holds)") from None
        cut = cut_short(path)
        raise CompileError(f"{path}: not an ONNX model ({one_line(e)}){'; ' + cut if cut else ''}") from None
    if not model.graph.node and not model.graph.output:
        raise CompileError(f"{path}: not an ONNX model ({'an empty file' if empty else 'no graph'})")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        locations = external_locations(model)
    except ValueError as e:  # an offset or length onnx refuses
        raise CompileError(f"{path}: its external data cannot be read ({one_line(e)})") from None
    missing = missing_external_file(locations, folder)
    if missing is not None:  # (onnx says "it is not regular file")
        raise CompileError(f"{path}: its external data cannot be read ({missing} does not exist)")
    _check_graph(path, model, locations)
    if not weights:
        return model
    inline = model.ByteSize() + external_bytes(locations, folder)
    if inline > MAX_INLINE_BYTES:  # (what the CPU runtime's OM embeds: the model with its weights)
        raise CompileError(f"{path}: the model with its external data is {inline / 2**30:.1f} GiB; the CPU "
                           "compiler takes models up to 2 GiB (an NPU's, through ATC, may be larger)")
    try:  # weights kept in files beside it (models over 2 GB), named relative to its folder
        onnx.load_external_data_for_model(model, folder)
    except Exception as e:
        raise CompileError(f"{path}: {link_refusal(e) or f'its external data cannot be read ({one_line(e)})'}") \
            from None
    return model


def _check_graph(path: str, model: onnx.ModelProto, locations: set[str]) -> None:
    """The ONNX checker, on ONNX Runtime's terms: it requires a shape (and a type) on every graph
    input and output ("Field 'shape' of 'type' is required but missing", naming none), which ORT
    and ATC do without (onnx-graphsurgeon writes outputs so). Those get an empty one for the check
    only: resolve() asks --input-shape for such an input; an output's is inferred and probed."""
    bare = [(vi, what, "shape" if vi.HasField("type") else "type")
            for what, group in (("input", model.graph.input), ("output", model.graph.output)) for vi in group
            if not vi.HasField("type") or (vi.type.WhichOneof("value") == "tensor_type"
                                           and not vi.type.tensor_type.HasField("shape"))]
    if bare and locations:  # (the checker reads such a model from its file: nothing to give it there)
        vi, what, lacking = bare[0]
        raise CompileError(f"{path}: {what} {vi.name!r} declares no {lacking}, which the ONNX checker requires "
                           "of a model with external data: give it one in the model")
    for vi, _, lacking in bare:
        vi.type.tensor_type.shape.SetInParent()
        if lacking == "type":
            vi.type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    try:  # (by path when it names external data: the checker finds those files from the model's folder)
        onnx.checker.check_model(path if locations else model, full_check=False)
    except Exception as e:
        raise CompileError(f"{path}: {link_refusal(e) or f'invalid ONNX graph: {one_line(e)}'}") from None
    finally:
        for vi, _, lacking in bare:
            if lacking == "type":
                vi.ClearField("type")
            else:
                vi.type.tensor_type.ClearField("shape")


def one_line(e: BaseException) -> str:
    """`e` in one line of at most about 400 characters: its start and its end, where ONNX
    Runtime and onnx put what went wrong (a cut at 300 kept the path and lost the reason)."""
    text = " ".join(str(e).split())
    if len(text) > 400:
        text = f"{text[:100]} ... {text[-300:]}"
    return text or type(e).__name__


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: graph inputs that are not initializers (IR < 4 lists weights as inputs)."""
    weights = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def dtype_of(vi: onnx.ValueInfoProto, what: str) -> np.dtype:
    if not vi.HasField("type"):  # (an input declaring none; an output whose shape inference found none)
        raise CompileError(f"{what} {vi.name!r} has no data type in the model")
    if not vi.type.HasField("tensor_type"):
        raise CompileError(not_a_tensor(what, vi))
    elem = vi.type.tensor_type.elem_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        numpy_to_acl(dtype)
    except (KeyError, ValueError, TypeError):
        raise CompileError(f"{what} {vi.name!r} has data type "
                           f"{onnx.TensorProto.DataType.Name(elem)}, which aclserve does not serve") from None
    return dtype


def dims_of(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Ints for fixed dims, the symbol (or None) for dynamic ones; None when rank is unknown. A
    negative dim_value is dynamic, unnamed, as ONNX Runtime reads it (a batch stored as -1)."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in tt.shape.dim]


def resolve(model: onnx.ModelProto, input_shape: dict[str, list[int]], gears: list[int] | None,
            batch_optional: bool = False) -> ModelSpec:
    """Apply shapes, decide the batch dimension and gears; rewrite the model's input shapes.

    A model is dynamic-batch when some input's first dim is dynamic (after --input-shape). Then
    every input's first dim must be dynamic and every other dim fixed; the first dims all become
    the shared symbol "batch". Without a dynamic first dim, --batch is refused, unless it is one
    size every input's first dim already fixes (--batch 1 on a model fixed at 1 compiles as that
    model: the OM it asks for), or `batch_optional` (sizes meant for every model, model_defaults'
    compile.batch: such a model compiles without them).
    """
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    if DYNAMIC_BATCH_INPUT in names:  # the OM would list it twice, and serving refuses that OM
        raise CompileError(f"input {DYNAMIC_BATCH_INPUT!r} has the name of the input ATC adds for dynamic "
                           "batch; rename it in the model")
    outputs = [o.name for o in model.graph.output]
    twice = sorted({name for name in outputs if outputs.count(name) > 1})
    if twice:  # (served, its metadata listed it twice)
        raise CompileError(f"output {twice[0]!r} is listed twice among the model's outputs")
    if not outputs:  # (said as ONNX Runtime's "At least one output should be requested" from the test run)
        raise CompileError("the model has no outputs: a served model answers with at least one")
    if not names:  # (served READY, every request was refused: inputs must be a non-empty array)
        raise CompileError("the model has no inputs: a served model computes its outputs from a request's inputs")
    passed = sorted(set(outputs) & set(names))
    if passed:  # (ONNX Runtime never writes the output buffer bound to it: every answer was zeros)
        raise CompileError(f"output {passed[0]!r} is the model's input itself, computed by no node; give it "
                           "an Identity node in the model")
    own = input_names(input_shape, names)  # (each name as given: " x " may be an input's)
    input_shape = {own[name]: dims for name, dims in input_shape.items()}
    resolved: list[tuple[onnx.ValueInfoProto, np.dtype, list]] = []
    opened = set()  # the export's fixed sizes of dimension 0 that --input-shape's -1 opened
    for vi in inputs:
        dtype = dtype_of(vi, "input")
        dims = dims_of(vi)
        if vi.name in input_shape:
            given = input_shape[vi.name]
            if dims is not None and len(dims) != len(given):
                raise CompileError(f"--input-shape gives input {vi.name!r} {len(given)} dims; the model has "
                                   f"{len(dims)}")
            for axis, (old, new) in enumerate(zip(dims or given, given)):
                if isinstance(old, int) and new != -1 and old != new:
                    raise CompileError(f"--input-shape sets input {vi.name!r} dim {axis} to {new}; the model fixes "
                                       f"it at {old}")
            if -1 in given[1:]:  # (the only dimension that may be dynamic: said here, not as "dim 1 is dynamic")
                raise CompileError(f"--input-shape gives input {vi.name!r} -1 past its first dimension: -1 marks "
                                   "the batch, which must come first (a sequence-first model needs its batch "
                                   "moved to dimension 0)")
            if dims and isinstance(dims[0], int) and given[0] == -1:
                opened.add(dims[0])
            dims = [None if d == -1 else d for d in given]
        if dims is None:
            raise CompileError(f"input {vi.name!r} has no shape in the model; give it with --input-shape")
        resolved.append((vi, dtype, dims))
    # (before "--batch given but ..."; an RNN's initial state told apart: its batch is at dimension 1 in any export)
    refuse_batch_past_first([(vi.name, dims) for vi, _, dims in resolved], rnn_states(model.graph))

    batched = [vi.name for vi, _, dims in resolved if dims and not isinstance(dims[0], int)]
    # (said to be the batch: by --batch, by a -1 in --input-shape, or by a symbol naming it, "batch_size")
    assumed = gears is None and not any(dims[:1] == [-1] for dims in input_shape.values()) and not any(
        isinstance(dims[0], str) and "batch" in dims[0].lower() for _, _, dims in resolved if dims)
    if gears is not None and not batched and (batch_optional or _fixed_at(resolved, gears)):
        gears = None
    if gears is not None and not batched:
        raise NoBatchDimension(NO_BATCH_DIMENSION)
    if batched and gears is not None and len(gears) == 1:
        # ATC's --dynamic_batch_size takes 2 to 100 sizes: one size compiles a static batch of it
        fixed = gears[0]
        _fix_symbols(model, {dims[0] for _, _, dims in resolved if dims and isinstance(dims[0], str)}, fixed)
        resolved = [(vi, dtype, [fixed] + list(dims[1:]) if dims and not isinstance(dims[0], int) else dims)
                    for vi, dtype, dims in resolved]
        batched, gears = [], None
    if batched and gears is None:
        gears = list(DEFAULT_GEARS)
    dynamic = bool(batched)

    shared = distinct_batch_symbols([(vi.name, dims) for vi, _, dims in resolved]) if dynamic else None
    if dynamic:  # declared output/value shapes name the batch by the inputs' old symbols
        _rename_symbols(model, {dims[0] for _, _, dims in resolved if dims and isinstance(dims[0], str)})
    infos = []
    for vi, dtype, dims in resolved:
        if dynamic and (not dims or isinstance(dims[0], int)):
            hint = _fixed_dim0_hint([(v.name, d) for v, _, d in resolved if d and not isinstance(d[0], int)])
            raise CompileError(f"input {vi.name!r} has no batch dimension first (shape {_show(dims)}); "
                               "with dynamic batch every input's first dimension must be the batch (or "
                               f"compile it for one batch size: --batch 1){hint if assumed else ''}")
        rest = dims[1:] if dynamic else dims
        if not all(isinstance(d, int) for d in rest):  # (every input's open dimensions said at once)
            refuse_open_dims([(v.name, d) for v, _, d in resolved], dynamic, set(input_shape))
        final = ([-1] + list(rest)) if dynamic else list(rest)
        refuse_empty("input", vi.name, final)
        _check_size(vi.name, dtype, final, gears[-1] if dynamic else None)
        _set_shape(vi, final)
        infos.append(TensorInfo(vi.name, dtype, final))
    return ModelSpec(model, infos, list(gears) if dynamic else [], batch_assumed=dynamic and assumed,
                     warnings=[shared] if shared else [], exported_batch=opened.pop() if len(opened) == 1 else None)


def _fixed_at(resolved: list[tuple], gears: list[int]) -> bool:
    """Whether the one batch size in `gears` is the size every input's first dimension fixes."""
    return len(gears) == 1 and all(dims and dims[0] == gears[0] for _, _, dims in resolved)


def _fixed_dim0_hint(inputs: list[tuple[str, list]]) -> str:
    """'; if dimension 0 is not a batch ... --input-shape "ids:16"' for the inputs (name, dims)
    whose dimension 0 was taken for the batch (16 for each open dimension: an example size)."""
    example = ";".join(f"{name}:" + ",".join(str(d) if isinstance(d, int) else "16" for d in [None] + list(dims[1:]))
                       for name, dims in inputs)
    return ("; if dimension 0 is not a batch (a sequence's length, say: --batch 1 would fix it at 1), give its "
            f"size instead, e.g. --input-shape \"{example}\"")


def refuse_empty(what: str, name: str, dims: list[int]) -> None:
    """A fixed dimension of 0 is a tensor without elements: the runtime refused the OM at load
    (the index then blamed the host: "a CPU OM ... rebuild it with ATC"), and no device buffer
    of no bytes is allocated for it; said at compile time instead."""
    if 0 in dims:
        raise CompileError(f"{what} {name!r} has a dimension of 0 (dims {_show(dims)}): a tensor without "
                           "elements, which aclserve cannot serve; give it at least one element")


def _check_size(name: str, dtype: np.dtype, dims: list[int], batch: int | None) -> None:
    """Refuse an input whose size in bytes (at the largest gear) no int64 holds: numpy, ONNX
    Runtime and ACL could never allocate it (it ended in a traceback from the probe run)."""
    size = dtype.itemsize
    for d in dims:
        size *= batch if d == -1 else d
    if size > MAX_DIM:
        at = f" at batch {batch}" if batch is not None else ""
        shown = f"{size:.3g}" if size.bit_length() <= 1000 else f"more than {MAX_DIM}"  # (a float ends at 1.8e308)
        raise CompileError(f"input {name!r} would take {shown} bytes{at} (dims {_show(dims)}); "
                           "lower --batch or --input-shape")


def _fix_symbols(model: onnx.ModelProto, old: set[str], value: int) -> None:
    """Declared output/value shapes: the batch symbols become the fixed batch size."""
    for vi in list(model.graph.output) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for dim in vi.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param in old:
                    dim.dim_value = value


def _rename_symbols(model: onnx.ModelProto, old: set[str]) -> None:
    for vi in list(model.graph.output) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for dim in vi.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param in old:
                    dim.dim_param = BATCH_SYMBOL


def _show(dims) -> str:
    return "[" + ",".join("?" if not isinstance(d, int) else str(d) for d in dims) + "]"


def _set_shape(vi: onnx.ValueInfoProto, dims: list[int]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if d == -1:
            dim.dim_param = BATCH_SYMBOL
        else:
            dim.dim_value = d
