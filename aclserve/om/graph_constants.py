"""The constant tensors of an ONNX graph, by name: its initializers and its Constant nodes' `value`
tensors, as the checks reading a graph's fixed values (index_bounds' tables, traced_batch's
Reshape shapes) take them. The graph's own level only (not its subgraphs'), and every initializer,
one a run may feed too (listed as an input) included: training_dropout.py, which must not count
those and reads scalars of value_* attributes too, scopes its own."""
from __future__ import annotations

import onnx


def graph_constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
    return constants
