"""The shapes an ONNX model declares for its outputs and intermediate values are the exporter's
word, not what its graph computes: a fixed-batch export's [1, 3] made dynamic, or a shape the
graph does not compute, compiled and then failed every run ("invalid dimensions for output"),
the model retried for good as a device fault. Each compile check that infers or runs the graph
drops them first."""
from __future__ import annotations

import onnx


def drop_declared_shapes(model: onnx.ModelProto) -> None:
    """Clear the shapes `model` declares for its outputs and its intermediate values."""
    for vi in model.graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
