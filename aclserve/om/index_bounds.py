"""Integer inputs that index a table of the model: how many entries the table has.

A token id past its embedding table is a client's mistake the device cannot name: ONNX Runtime
fails the run (the CPU runtime's device fault: a 500, the instance rebuilt), and CANN's GatherV2
kernels differ (the AI CPU one fails the task, the AI Core one gives zeros for an index out of
[0, n), a wrong answer). Read from the ONNX graph at compile time, the bound lets the server
refuse such a request with a 400 before it reaches the device (server/values.py).

An input is bounded when its values reach the indices of a Gather over a constant table,
directly or through ops that keep them (a Cast to an integer type, Reshape, Squeeze,
Unsqueeze, Flatten, Identity); the bound is the smallest such table's size along the Gather's
axis, and no more than the largest value each Cast on the way keeps (INT64 ids cast to INT8
before a table of 200 index it correctly up to 127 only). A value a narrowing Cast would wrap
into the table (300 through UINT8 is entry 44) is refused too: no client means it. Negative
indices (which ONNX counts from the end) are out of range too: the device's kernels do not
all take them. Pure functions of the graph.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graph_constants import graph_constants

# the rules' edition: a compile cache entry whose bounds were read under another is read again
RULES = 2
INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                           TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
# ops whose first input's values reach their output unchanged (a Cast: those its type holds)
PASS_THROUGH = frozenset({"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def index_bounds(graph: onnx.GraphProto) -> dict[str, int]:
    """{input name: n} for each integer input whose values index a constant table of n entries."""
    tables = {name: list(tensor.dims) for name, tensor in graph_constants(graph).items()}
    readers = defaultdict(list)  # tensor -> [(node, input position)]
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers[name].append((node, position))
    bounds = {}
    for graph_input in graph.input:
        if graph_input.name in tables or graph_input.type.tensor_type.elem_type not in INTEGER_TYPES:
            continue  # (an initializer listed as an input, as older exporters write them)
        bound = _smallest_table(graph_input.name, readers, tables)
        if bound is not None:
            bounds[graph_input.name] = bound
    return bounds


def _smallest_table(name: str, readers: dict, tables: dict) -> int | None:
    """The bound of the values of input `name`: the smallest table they index, and no more than
    each integer type they are cast to on the way holds above 0 (a value past it wraps)."""
    smallest, seen, reached = None, set(), [(name, None)]
    while reached:
        tensor, held = reached.pop()  # held: values from 0 up to this one keep through the casts so far
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, position in readers.get(tensor, ()):
            if node.op_type == "Gather" and position == 1 and node.input[0] in tables:
                dims = tables[node.input[0]]
                axis = _attr(node, "axis", 0)
                axis = axis + len(dims) if axis < 0 else axis
                if 0 <= axis < len(dims):
                    entries = dims[axis] if held is None else min(dims[axis], held)
                    smallest = entries if smallest is None else min(smallest, entries)
            elif node.op_type in PASS_THROUGH and position == 0:
                to = _attr(node, "to", None) if node.op_type == "Cast" else None
                if to is not None and to not in INTEGER_TYPES:
                    continue  # through a float the values may change: not followed
                top = None if to is None else int(np.iinfo(helper.tensor_dtype_to_np_dtype(to)).max) + 1
                keeps = held if top is None else top if held is None else min(held, top)
                reached.extend((out, keeps) for out in node.output if out)
    return smallest


def _attr(node, name: str, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
