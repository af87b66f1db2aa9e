"""A real ONNX model (two inputs, two outputs of different dtypes) for the runtime tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 4)).astype(np.float32)
B = RNG.standard_normal((4,)).astype(np.float32)


def affine_onnx(path, scale: float = 1.0) -> str:
    """y = (x @ W + b) * scale (FP32 [N,8] -> [N,4]); s = row sums of idx*2 (INT64 [N,3] -> [N,3])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, ["batch", 3])
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(np.array(scale, np.float32), "scale"),
             numpy_helper.from_array(np.array(2, np.int64), "two")]
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["g"]),
             helper.make_node("Mul", ["g", "scale"], ["y"]),
             helper.make_node("Mul", ["idx", "two"], ["s"])]
    graph = helper.make_graph(nodes, "affine", [x, idx], [y, s], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def affine_reference(x: np.ndarray, idx: np.ndarray, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": (x @ W + B) * np.float32(scale), "s": idx * 2}


