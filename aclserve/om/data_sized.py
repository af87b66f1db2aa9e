"""Outputs whose size follows the input's values, refused from the graph before any test run.

An OM's outputs have the sizes fixed when it is compiled (ATC makes an unknown-shape OM of such
a model, which the server refuses at load). The CPU compile's test runs compared the sizes on
zeros, ones and fixed random values, which cannot find them all: a static [1, 4] model's
`NonZero(x < 5)` is [2, 4] on all three, compiled so, and `[1, 2, 3, 9]` then failed every
request as a device fault (found by an independent tester).

Read from the graph instead: an output whose shape ONNX shape inference cannot fix (a dimension
neither a number nor the batch) and that comes from an operator whose output size the ONNX spec
makes depend on values: NonZero, Unique, Compress, NonMaxSuppression (their results' counts),
or an operator sized by an input (TopK's K, Reshape's shape, Range's limit, ...) whose values are
computed from the model's inputs, not from shapes or constants. A result brought back to a fixed
size (summed, its Shape, TopK with a constant K: a size inference fixes) passes; one inference
cannot follow (padded by a computed amount) is refused, the message saying what to do.
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass

import onnx
from onnx import helper, shape_inference

from .declared_shapes import drop_declared_shapes
from .spec import BATCH_SYMBOL, CompileError, ModelSpec
from .subgraphs import subgraphs

# operators whose output size is a count of what their input's values hold
COUNTED = {"NonZero": "the count of non-zero values", "Unique": "the count of distinct values",
           "Compress": "the count of true conditions", "NonMaxSuppression": "the count of boxes kept",
           "StringSplit": "the count of substrings", "StringNormalizer": "the count of words not stopped",
           "ImageDecoder": "the size of the encoded image"}
# operators whose output size is set by the values of some inputs: {op: (positions, what they are)}
SIZED_BY = {
    "TopK": ((1,), "K"), "Reshape": ((1,), "shape"), "Expand": ((1,), "shape"), "Tile": ((1,), "repeats"),
    "ConstantOfShape": ((0,), "shape"), "Range": ((0, 1, 2), "start, limit and delta"),
    "Slice": ((1, 2, 3, 4), "starts, ends, axes and steps"), "Pad": ((1, 3), "pads"),
    "Upsample": ((1,), "scales"), "OneHot": ((1,), "depth"), "Split": ((1,), "split"),
    "SplitToSequence": ((1,), "split"), "Squeeze": ((1,), "axes"), "Unsqueeze": ((1,), "axes"),
    "CenterCropPad": ((1,), "shape"), "Col2Im": ((1, 2), "image_shape and block_shape"),
    "MaxUnpool": ((2,), "output_shape"), "DFT": ((1,), "dft_length"), "STFT": ((1, 3), "frame_step and frame_length"),
    "HannWindow": ((0,), "size"), "HammingWindow": ((0,), "size"), "BlackmanWindow": ((0,), "size"),
    "MelWeightMatrix": ((0, 1), "num_mel_bins and dft_length"), "AffineGrid": ((1,), "size"),
    "Loop": ((0, 1), "trip count and condition"),
    **{op: ((1,), "axes") for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                     "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
SHAPE_READERS = {"Shape", "Size"}  # their values are their input's size, not its values


@dataclass(frozen=True)
class Culprit:
    op_type: str
    node: str
    why: str  # what sizes its output

    def said(self) -> str:
        named = f" (node {self.node!r})" if self.node else ""
        return f"{self.op_type}{named}, whose output size is {self.why}"


def check_source(spec: ModelSpec) -> None:
    """refuse_data_sized for a model ATC builds, inferred here (the CPU compile infers its own
    shapes: output_types). A model ONNX shape inference fails on is left to ATC."""
    model = onnx.ModelProto()
    model.CopyFrom(spec.model)
    drop_declared_shapes(model)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        return
    refuse_data_sized(inferred, spec)


def refuse_data_sized(inferred: onnx.ModelProto, spec: ModelSpec) -> None:
    """Raise CompileError naming the first output of `inferred` (shape inference's result, the
    declared shapes dropped) whose size follows the input's values, and the operator it comes from."""
    dims = {}
    _read_shapes(inferred.graph, spec.dynamic_batch, dims)
    opset = next((o.version for o in inferred.opset_import if o.domain in ("", "ai.onnx")), 0)
    flow = _Flow(dims, opset)
    sizes: dict = {}
    flow.graph(inferred.graph, ChainMap(sizes), ChainMap({i.name: i.name for i in inferred.graph.input}))
    for output in inferred.graph.output:
        culprit = sizes.get(output.name)
        if culprit is not None:
            raise CompileError(
                f"output {output.name!r} changes size with the input's values: it comes from {culprit.said()}, "
                f"and ONNX shape inference cannot fix its shape ({_shown(output)}); an OM's outputs have the "
                "sizes fixed when it is compiled; bring the output to a fixed size in the graph (e.g. TopK with a "
                "constant K)")


class _Flow:
    """One pass over a graph in its (topological) order, per tensor: `sizes`, the Culprit its
    size follows (None: a size of shapes and constants); `values`, what its values follow
    (None; an input's name; a Culprit, for the size of a data-sized tensor, read by Shape)."""

    def __init__(self, dims: dict[str, list[bool] | None], opset: int):
        self.dims = dims
        self.opset = opset

    def fixed(self, name: str) -> bool:
        return self.dims.get(name) is not None and all(self.dims[name])

    def _fixed_but_axis(self, node: onnx.NodeProto) -> bool:
        dims = self.dims.get(node.input[0])
        if dims is None:
            return False
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -1)
        return all(fixed for k, fixed in enumerate(dims) if k != axis % max(len(dims), 1))

    def graph(self, graph: onnx.GraphProto, sizes: ChainMap, values: ChainMap) -> None:
        for init in graph.initializer:
            sizes[init.name], values[init.name] = None, None
        for node in graph.node:
            inputs = [name for name in node.input if name]
            bodies = subgraphs(node)
            inner_sizes, inner_values = [], []
            for body in bodies:  # a body's inputs follow the node's (Loop: iteration, condition, carried)
                body_sizes, body_values = sizes.new_child(), values.new_child()
                for k, formal in enumerate(body.input):
                    outer = node.input[k] if k < len(node.input) and (node.op_type != "Loop" or k) else ""
                    body_sizes[formal.name] = sizes.get(outer)
                    body_values[formal.name] = values.get(outer)
                self.graph(body, body_sizes, body_values)
                inner_sizes += [body_sizes.get(o.name) for o in body.output]
                inner_values += [body_values.get(o.name) for o in body.output]
            if node.op_type in SHAPE_READERS:
                value = sizes.get(inputs[0]) if inputs else None
            elif node.op_type == "Constant":
                value = None
            else:
                value = _first([values.get(name) for name in inputs] + inner_values)
            size = self._size_culprit(node, inputs, sizes, values, inner_sizes, inner_values)
            for name in node.output:
                if name:
                    values[name] = value
                    sizes[name] = None if self.fixed(name) else size

    def _size_culprit(self, node, inputs, sizes, values, inner_sizes, inner_values) -> Culprit | None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            return _first([sizes.get(name) for name in inputs] + inner_sizes)
        if op in COUNTED:
            return Culprit(op, node.name, COUNTED[op])
        if op == "TopK" and (len(inputs) < 2 or values.get(node.input[1]) is None) and self._fixed_but_axis(node):
            return None  # K of shapes and constants: its size along the axis is K (shape inference wants that dim)
        positions, what = SIZED_BY.get(op, ((), ""))
        if op == "Resize":  # (X, scales) until opset 11, then (X, roi, scales, sizes)
            positions, what = ((1,), "scales") if self.opset < 11 else ((2, 3), "scales or sizes")
        if op == "Loop" and inner_values:  # a while loop: its condition computed in the body
            sized = _first([values.get(node.input[p]) for p in positions if p < len(node.input)] + inner_values[:1])
        else:
            sized = _first([values.get(node.input[p]) for p in positions if p < len(node.input)])
        if isinstance(sized, Culprit):  # (the size of a data-sized tensor: that one is the cause)
            return sized
        if sized is not None:
            return Culprit(op, node.name, f"set by its {what}, computed from the values of input {sized!r}")
        return _first([sizes.get(name) for name in inputs] + inner_sizes)


def _read_shapes(graph: onnx.GraphProto, dynamic: bool, dims: dict) -> None:
    """{tensor: [whether inference fixed each dimension]} (None: not even its rank) over the graph
    and its bodies; fixed: a number, or the batch of a dynamic-batch model."""
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        shaped = vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
        dims[vi.name] = [d.HasField("dim_value") or (dynamic and d.dim_param == BATCH_SYMBOL)
                         for d in vi.type.tensor_type.shape.dim] if shaped else None
    for init in graph.initializer:
        dims[init.name] = [True] * len(init.dims)
    for node in graph.node:
        for body in subgraphs(node):
            _read_shapes(body, dynamic, dims)


def _shown(vi: onnx.ValueInfoProto) -> str:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return "not even its rank"
    dims = [str(d.dim_value) if d.HasField("dim_value") else "N" if d.dim_param == BATCH_SYMBOL else "?"
            for d in vi.type.tensor_type.shape.dim]
    return "[" + ",".join(dims) + "]"


def _first(items: list):
    return next((item for item in items if item is not None), None)
