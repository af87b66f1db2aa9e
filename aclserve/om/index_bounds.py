"""Integer inputs that index a table of the model: how many entries the table has.

A token id past its embedding table is a client's mistake the device cannot name: ONNX Runtime
fails the run (the CPU runtime's device fault: a 500, the instance rebuilt), and CANN's GatherV2
kernels differ (the AI CPU one fails the task, the AI Core one gives zeros for an index out of
[0, n), a wrong answer). Read from the ONNX graph at compile time, the bound lets the server
refuse such a request with a 400 before it reaches the device (server/values.py).

An input is bounded when its values reach the indices of a Gather over a constant table,
directly or through ops that keep them (a Cast to an integer type that holds every value of
the one before it, Reshape, Squeeze, Unsqueeze, Flatten, Identity); the bound is the smallest such table's size along the Gather's
axis. Negative indices (which ONNX counts from the end) are out of range too: the device's
kernels do not all take them. Pure functions of the graph.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, helper

INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                           TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
# ops whose first input's values reach their output unchanged (a Cast: when its type holds them, _holds)
PASS_THROUGH = frozenset({"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def index_bounds(graph: onnx.GraphProto) -> dict[str, int]:
    """{input name: n} for each integer input whose values index a constant table of n entries."""
    tables = {init.name: list(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = list(value.dims)
    readers = defaultdict(list)  # tensor -> [(node, input position)]
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers[name].append((node, position))
    bounds = {}
    for graph_input in graph.input:
        if graph_input.name in tables or graph_input.type.tensor_type.elem_type not in INTEGER_TYPES:
            continue  # (an initializer listed as an input, as older exporters write them)
        bound = _smallest_table(graph_input.name, graph_input.type.tensor_type.elem_type, readers, tables)
        if bound is not None:
            bounds[graph_input.name] = bound
    return bounds


def _smallest_table(name: str, elem_type: int, readers: dict, tables: dict) -> int | None:
    smallest, seen, reached = None, set(), [(name, elem_type)]
    while reached:
        tensor, kind = reached.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, position in readers.get(tensor, ()):
            if node.op_type == "Gather" and position == 1 and node.input[0] in tables:
                dims = tables[node.input[0]]
                axis = _attr(node, "axis", 0)
                axis = axis + len(dims) if axis < 0 else axis
                if 0 <= axis < len(dims):
                    smallest = dims[axis] if smallest is None else min(smallest, dims[axis])
            elif node.op_type in PASS_THROUGH and position == 0:
                to = _attr(node, "to", None) if node.op_type == "Cast" else kind
                if _holds(to, kind):
                    reached.extend((out, to) for out in node.output if out)
    return smallest


def _attr(node, name: str, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _holds(to, kind: int) -> bool:
    """Whether integer type `to` holds every value of integer type `kind` (a Cast to it keeps
    them: a narrowing one wraps, so 300 through UINT8 indexes entry 44 of a table of 256)."""
    if to not in INTEGER_TYPES or kind not in INTEGER_TYPES:
        return False
    wide, narrow = (np.iinfo(helper.tensor_dtype_to_np_dtype(t)) for t in (to, kind))
    return wide.min <= narrow.min and narrow.max <= wide.max
