"""Tiny ONNX models built with onnx.helper, their numpy references, and compiling them to CPU OMs.

Shared by the runtime, repository and server tests; models only one folder needs stay there."""
from __future__ import annotations

import json
import struct

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aclserve.om import container
from aclserve.om.compile import compile_model

RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 4)).astype(np.float32)
B = RNG.standard_normal((4,)).astype(np.float32)


def save_graph(graph: onnx.GraphProto, path) -> str:
    """The graph as an opset-17 model (IR 8) at `path`; returns the path as a string."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def affine_onnx(path, scale: float = 1.0) -> str:
    """y = (x @ W + b) * scale (FP32 [N,8] -> [N,4]); s = idx * 2 (INT64 [N,3] -> [N,3])."""
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
    return save_graph(helper.make_graph(nodes, "affine", [x, idx], [y, s], inits), path)


def affine_reference(x: np.ndarray, idx: np.ndarray, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": (x @ W + B) * np.float32(scale), "s": idx * 2}

def affine_request(rows: int, first_id: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the affine model: `rows` rows, tagged by their ids in idx (distinct per call)."""
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    x = np.random.default_rng(first_id).standard_normal((rows, 8)).astype(np.float32)
    return {"x": x, "idx": np.stack([ids, ids + 1, ids + 2], axis=1)}



def double_onnx(path) -> str:
    """y = 2 * x (FP32 [N,16] -> [N,16]): a single-input model for raw binary requests."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two")]
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], inits),
                      path)


def scale_onnx(path, scale: float) -> str:
    """y = x * scale (FP32 [N,4] -> [N,4]): the scale tells model versions apart in answers."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale")]
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scale", [x], [y], inits),
                      path)


def kinds_onnx(path) -> str:
    """Outputs of the kinds a classification cannot rank beside one it can: x FP32 [N,4] -> y = 2x
    FP32 and h = x as FP16 [N,4]; b BOOL [N,3] -> n = not b BOOL [N,3]."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"]),
             helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Not", ["b"], ["n"])]
    graph = helper.make_graph(nodes, "kinds",
                              [vi("x", TensorProto.FLOAT, ["N", 4]), vi("b", TensorProto.BOOL, ["N", 3])],
                              [vi("y", TensorProto.FLOAT, ["N", 4]), vi("h", TensorProto.FLOAT16, ["N", 4]),
                               vi("n", TensorProto.BOOL, ["N", 3])],
                              [numpy_helper.from_array(np.array(2, np.float32), "two")])
    return save_graph(graph, path)


# ImageNet's per-channel mean and std: the normalisation the image tests compile into conv models
MEAN = np.array([123.675, 116.28, 103.53], np.float32)
STD = np.array([58.395, 57.12, 57.375], np.float32)


def conv_onnx(path, channels: int = 3, side: int = 16) -> str:
    """x FP32 [N, C, side, side] -> Conv 3x3 (4 filters) -> y [N, 4, side, side]."""
    vi = helper.make_tensor_value_info
    w = np.random.default_rng(3).standard_normal((4, channels, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "conv",
                              [vi("x", TensorProto.FLOAT, ["N", channels, side, side])],
                              [vi("y", TensorProto.FLOAT, ["N", 4, side, side])], [numpy_helper.from_array(w, "w")])
    return save_graph(graph, path)


TOKEN_ROWS = 50
TOKEN_TABLE = np.arange(TOKEN_ROWS * 2, dtype=np.float32).reshape(TOKEN_ROWS, 2)


def token_graph():
    """ids INT32 [N, 3], cast to INT64 and unsqueezed before the Gather of a [50, 2] table
    (the values reach the indices through ops that keep them) -> [N, 3, 2]."""
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids4"]),
             helper.make_node("Squeeze", ["ids4", "axes"], ["ids3"]),
             helper.make_node("Gather", ["table", "ids3"], ["emb"], axis=0)]
    return helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["N", 3])],
                             [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 3, 2])],
                             [numpy_helper.from_array(TOKEN_TABLE, "table"),
                              numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")])


def compile_cpu_om(onnx_path, om_path, batch: str = "1,2,4,8", **options) -> str:
    """`aclserve compile --target cpu` in process, quietly; returns the OM's path."""
    return str(compile_model(onnx_path, om_path, batch=batch, target="cpu", log=lambda _: None, **options).path)


def tiny_cpu_om_bytes() -> bytes:
    """A whole CPU OM of fewer than 256 bytes (an Identity, its header without checksums), which the
    CPU runtime loaded once: what a device refuses for its size, the CPU runtime refuses too."""
    tensor = {"datatype": "FP32", "dims": [1]}
    header = {"inputs": [dict(tensor, name="x")], "outputs": [dict(tensor, name="y")]}
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    payload = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7).SerializeToString()
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<8sIIQ", container.MAGIC, container.VERSION, len(raw), len(payload)) + raw + payload


def endless_loop_onnx(path, trips: int = 10**12) -> str:
    """y = x + Loop(`trips` iterations of v + 1) (FP32 [N,4] -> [N,4]): with 10**12, a valid model
    whose every run goes on for about a day, so a CPU compile's test runs of it never end (its
    initializer "trips" holds the count)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", TensorProto.FLOAT, [1])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "cond"), numpy_helper.from_array(np.array([0.0], np.float32), "v")]
    nodes = [helper.make_node("Loop", ["trips", "cond", "v"], ["v_final"], body=body),
             helper.make_node("Add", ["x", "v_final"], ["y"])]
    return save_graph(helper.make_graph(nodes, "endless_loop", [vi("x", TensorProto.FLOAT, ["N", 4])],
                                        [vi("y", TensorProto.FLOAT, ["N", 4])], inits), path)


def weighty_onnx(path) -> str:
    """y = x @ W, W 64x512 FP32: 128 KB of weights, twice a 64 KB tmpfs (a disk too small for it)."""
    weights = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    return save_graph(helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "weighty",
                                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 512])],
                                        [numpy_helper.from_array(weights, "W")]), path)


def dropout_onnx(path, training: bool, given_as: str = "constant", ratio: float | None = 0.5) -> str:
    """y = Gemm(Dropout(Relu(Gemm(x)))), x FP32 [N,8] -> [N,4], as PyTorch exports nn.Dropout: its
    training_mode (`training`) a Constant node ("constant"), an initializer, a Constant of 1.0 or
    0.0 cast to bool ("cast"), or that Constant read by the Dropout inside an If's then-branch
    ("branch"); `ratio` None leaves it out (0.5)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (8, 8)), ("b1", (8,)), ("w2", (8, 4)), ("b2", (4,)))]
    mode = np.array(training, np.float32 if given_as == "cast" else np.bool_)
    if given_as == "initializer":
        inits.append(numpy_helper.from_array(mode, "mode"))
        nodes = []
    else:
        nodes = [helper.make_node("Constant", [], ["mode"], value=numpy_helper.from_array(mode))]
    if given_as == "cast":
        nodes.append(helper.make_node("Cast", ["mode"], ["mode_b"], to=TensorProto.BOOL))
    if ratio is not None:
        inits.append(numpy_helper.from_array(np.array(ratio, np.float32), "ratio"))
    dropout = helper.make_node("Dropout", ["h", "ratio" if ratio is not None else "",
                                           "mode_b" if given_as == "cast" else "mode"], ["d"], name="/dropout/Dropout")
    nodes += [helper.make_node("Gemm", ["x", "w1", "b1"], ["g"]), helper.make_node("Relu", ["g"], ["h"])]
    if given_as == "branch":  # (its branches read h and mode from the main graph)
        branches = [helper.make_graph([node], name, [], [helper.make_tensor_value_info("d", TensorProto.FLOAT, None)])
                    for node, name in ((dropout, "then"), (helper.make_node("Identity", ["h"], ["d"]), "else"))]
        nodes += [helper.make_node("Constant", [], ["yes"], value=numpy_helper.from_array(np.array(True))),
                  helper.make_node("If", ["yes"], ["d"], then_branch=branches[0], else_branch=branches[1])]
    else:
        nodes.append(dropout)
    nodes.append(helper.make_node("Gemm", ["d", "w2", "b2"], ["y"]))
    graph = helper.make_graph(nodes, "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    return save_graph(graph, path)
