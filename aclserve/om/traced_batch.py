"""A batch size an export traced into its graph, said when a CPU compile that opened the batch (a
-1 in --input-shape over the export's fixed dimension 0) fails its test runs at another size.
PyTorch's x.view(x.shape[0], -1), traced at batch 2 without dynamic_axes, writes Reshape(x, [2, -1]);
ONNX Runtime's refusal at batch 1 ("GEMM: Dimension mismatch, W: {3,256} K: 128") said neither
(a tester, t96). Only a Reshape whose shape is a constant in the graph (an initializer, a Constant
node) starting with that size is named; otherwise the hint is the general one.
"""
from __future__ import annotations

import onnx
from onnx import numpy_helper

from .graph_constants import graph_constants

_WAY_OUT = "export it with dynamic_axes / dynamic_shapes naming its batch"


def traced_batch_hint(graph: onnx.GraphProto, exported: int | None, failed: int | None) -> str:
    """"; the export may have fixed ..." for a test run that failed at batch size `failed` of a
    model exported at batch size `exported` (ModelSpec.exported_batch); "" when that size is not
    known, or is the one that failed."""
    if exported is None or failed is None or failed == exported:
        return ""
    reshape = _reshape_starting_with(graph, exported)
    if reshape is not None:
        node, shape = reshape
        named = f" {node.name!r}" if node.name else ""
        return (f"; the export may have fixed the batch size in a Reshape (node{named} reshapes to {shape}, "
                f"{exported} the batch size of the export, whose dimension 0 --input-shape opened: "
                f"x.view(x.shape[0], ...) traced): {_WAY_OUT}")
    return (f"; the model was exported at batch size {exported}, whose dimension 0 --input-shape opened: an export "
            f"traced at one batch size may have fixed it in the graph; {_WAY_OUT}")


def _reshape_starting_with(graph: onnx.GraphProto, size: int) -> tuple[onnx.NodeProto, str] | None:
    """The first Reshape whose shape is a constant of the graph starting with `size`, and that
    shape as text ("[2, -1]")."""
    constants = graph_constants(graph)
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        tensor = constants.get(node.input[1])
        if tensor is None or len(tensor.dims) != 1 or not tensor.dims[0]:
            continue
        try:
            shape = numpy_helper.to_array(tensor)
        except Exception:  # (external data not loaded, an odd type: not this hint's to judge)
            continue
        if shape.dtype.kind in "iu" and int(shape[0]) == size:
            return node, "[" + ", ".join(map(str, shape.tolist()[:8])) + (", ...]" if len(shape) > 8 else "]")
    return None
