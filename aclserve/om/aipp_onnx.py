"""Static AIPP reproduced in ONNX for the CPU OM.

Each bound AIPP input becomes a uint8 NHWC graph input of the same name, followed by
Slice (crop) -> Gather (R/B swap) -> Cast -> Sub (mean) -> Sub (min) -> Mul (var_reci) ->
Transpose to NCHW -> Pad (padding_value) -> Cast to the model's float type, whose result
feeds every node that read the original input. So the CPU OM takes exactly the input an ATC
OM with the same config takes (dtype, layout, shape, size).

The arithmetic is the device's: AIPP turns uint8 into fp16 as
`(half(pixel - mean_chn) - half(min_chn)) * half(var_reci_chn)`, each step rounded to fp16
(hicann/ops-cv image/aipp/op_kernel/arch35/aipp_base.h DataConversion; ATC stores min_chn and
var_reci_chn as fp16, gekowa/ascend-opp aipp_comm.py get_fp16; the template types them
float16 and padding_value in the output's type). The constants are rounded to fp16 here and
every step's result is rounded through a Cast to FLOAT16 and back (ONNX Runtime would compute
FLOAT16 Sub/Mul in float32 without rounding in between), so the model sees the fp16 values the
AIPP output holds. float32 arithmetic differed by up to 2.8e-3 (ImageNet values, pixel 255).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .aipp import BoundAipp
from .spec import BATCH_SYMBOL, CompileError, ModelSpec, TensorInfo
from .subgraphs import subgraphs

_FLOAT_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
                np.dtype(np.float64): TensorProto.DOUBLE}


def apply(spec: ModelSpec, bound: list[BoundAipp]) -> ModelSpec:
    """Rewrite spec.model in place and return a spec whose AIPP inputs are uint8 NHWC."""
    graph = spec.model.graph
    for i, node in enumerate(graph.node):  # fix the names ATC-style outputs derive from before shifting
        node.name = node.name or f"{node.op_type}_{i}"
    replaced = {}
    for b in bound:
        name = b.input.name
        if any(o.name == name for o in graph.output):
            raise CompileError(f"AIPP input {name!r} is also a graph output; the CPU OM cannot rewrite it")
        inner = f"{name}__aipp"
        _rename_uses(graph, name, inner)
        nodes, inits = _chain(b, name, inner)
        rest = list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes + rest)  # in front: the graph stays topologically sorted
        graph.initializer.extend(inits)
        vi = next(v for v in graph.input if v.name == name)
        vi.type.tensor_type.elem_type = TensorProto.UINT8
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in b.image_dims:
            dim = shape.dim.add()
            if d == -1:
                dim.dim_param = BATCH_SYMBOL
            else:
                dim.dim_value = d
        replaced[name] = TensorInfo(name, np.dtype(np.uint8), b.image_dims, "NHWC")
    inputs = [replaced.get(t.name, t) for t in spec.inputs]
    return dataclasses.replace(spec, inputs=inputs, model_inputs=spec.model_inputs or spec.inputs)


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Point every reader of `old` (subgraphs included) at `new`."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in subgraphs(node):
            _rename_uses(sub, old, new)


def fp16(values) -> np.ndarray:
    """float32 array of `values` rounded to fp16, as AIPP holds them."""
    return np.asarray(values, np.float32).astype(np.float16).astype(np.float32)


def _chain(b: BoundAipp, source: str, result: str) -> tuple[list, list]:
    op, p = b.op, f"aipp_{source}_"
    nodes, inits = [], []
    cur = source

    def const(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), p + "const_" + name))
        return p + "const_" + name

    def step(op_type: str, inputs: list[str], out: str, **attrs) -> None:
        nonlocal cur
        nodes.append(helper.make_node(op_type, inputs, [p + out], name=p + out, **attrs))
        cur = p + out

    if b.crop_box is not None:
        top, left, h, w = b.crop_box
        step("Slice", [cur, const("crop_starts", np.array([top, left], np.int64)),
                       const("crop_ends", np.array([top + h, left + w], np.int64)),
                       const("crop_axes", np.array([1, 2], np.int64))], "crop")
    if op.rbuv_swap_switch and op.channels == 3:
        step("Gather", [cur, const("swap", np.array([2, 1, 0], np.int64))], "swap", axis=3)
    def to_fp16(name: str) -> None:  # round the current float32 result to the nearest fp16
        step("Cast", [cur], name + "_fp16", to=TensorProto.FLOAT16)
        step("Cast", [cur], name, to=TensorProto.FLOAT)

    n = op.channels
    step("Cast", [cur], "float", to=TensorProto.FLOAT)
    step("Sub", [cur, const("mean", np.array(op.mean_chn[:n], np.float32))], "less_mean")  # integers: exact
    step("Sub", [cur, const("min", fp16(op.min_chn[:n]))], "less_min_f32")
    to_fp16("less_min")
    step("Mul", [cur, const("var_reci", fp16(op.var_reci_chn[:n]))], "scaled_f32")
    to_fp16("scaled")
    step("Transpose", [cur], "nchw", perm=[0, 3, 1, 2])
    if op.padding:
        pads = [0, 0, op.top_padding_size, op.left_padding_size, 0, 0, op.bottom_padding_size, op.right_padding_size]
        step("Pad", [cur, const("pads", np.array(pads, np.int64)),
                     const("pad_value", fp16(op.padding_value))], "padded", mode="constant")
    nodes.append(helper.make_node("Cast", [cur], [result], name=p + "to_model", to=_FLOAT_TYPES[b.input.dtype]))
    return nodes, inits
