"""Small ONNX models for the compile tests, built with onnx.helper into tmp folders; the CLI run
from the repository root; the stand-in `atc` (atc_stand_in.py) on a temporary folder."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import REPO

from .atc_stand_in import FAKE_ATC


def save(model: onnx.ModelProto, path) -> str:
    model.ir_version = 9
    onnx.save(model, str(path))
    return str(path)


def quiet(_line):
    """A compile's log that says nothing (compile_model's `log`)."""


def saved_onnx(tmp_path, name, nodes, inputs, outputs, inits=()) -> str:
    """A graph of `nodes` saved as tmp_path/<name>.onnx (opset 17): its path."""
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / f"{name}.onnx")


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def multi_io_model() -> onnx.ModelProto:
    """4 inputs (float32, int32, int64, float16) and 4 outputs of mixed dtypes, batch dim "n"."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Mul", ["a", "two"], ["y_f32"]),
        helper.make_node("Mul", ["b", "b"], ["y_i32"]),
        helper.make_node("ReduceSum", ["c", "axis1"], ["y_i64"], keepdims=1),
        helper.make_node("Cast", ["a"], ["a16"], to=TensorProto.FLOAT16),
        helper.make_node("Concat", ["a16", "d"], ["y_f16"], axis=1),
    ]
    inits = [numpy_helper.from_array(np.array([2.0], np.float32), "two"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    return _model(
        nodes,
        [vi("a", TensorProto.FLOAT, ["n", 4]), vi("b", TensorProto.INT32, ["n", 3]),
         vi("c", TensorProto.INT64, ["n", 2]), vi("d", TensorProto.FLOAT16, ["n", 5])],
        [vi("y_f32", TensorProto.FLOAT, ["n", 4]), vi("y_i32", TensorProto.INT32, ["n", 3]),
         vi("y_i64", TensorProto.INT64, ["n", 1]), vi("y_f16", TensorProto.FLOAT16, ["n", 9])],
        inits)


def multi_io_feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + batch)
    return {"a": rng.standard_normal((batch, 4)).astype(np.float32),
            "b": rng.integers(-1000, 1000, (batch, 3)).astype(np.int32),
            "c": rng.integers(-2**40, 2**40, (batch, 2)).astype(np.int64),
            "d": rng.standard_normal((batch, 5)).astype(np.float16)}


def static_model() -> onnx.ModelProto:
    """No batch dimension: x FP32 [2, 3] -> y = Relu(x)."""
    vi = helper.make_tensor_value_info
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])


def seq_model() -> onnx.ModelProto:
    """x FP32 [batch, seq] with seq dynamic too: needs --input-shape to fix seq."""
    vi = helper.make_tensor_value_info
    return _model([helper.make_node("Neg", ["x"], ["y"])],
                  [vi("x", TensorProto.FLOAT, ["batch", "seq"])], [vi("y", TensorProto.FLOAT, ["batch", "seq"])])


def scalar_output_model() -> onnx.ModelProto:
    """x [batch, 4] -> ReduceSum over everything: an output without the batch dimension."""
    vi = helper.make_tensor_value_info
    return _model([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
                  [vi("x", TensorProto.FLOAT, ["batch", 4])], [vi("y", TensorProto.FLOAT, [])])


def reshape_model() -> onnx.ModelProto:
    """x [batch, 2, 4] -> Reshape to [-1, 8]: shape inference cannot name the output's first dim."""
    vi = helper.make_tensor_value_info
    shape = numpy_helper.from_array(np.array([-1, 8], np.int64), "shape")
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [vi("x", TensorProto.FLOAT, ["batch", 2, 4])], [vi("y", TensorProto.FLOAT, ["m", 8])], [shape])


def run_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    """`python -m aclserve ARGS` from the repository root."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "aclserve", *map(str, args)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def multi_io_onnx(tmp_path) -> str:
    return save(multi_io_model(), tmp_path / "multi.onnx")


@pytest.fixture
def static_onnx(tmp_path) -> str:
    return save(static_model(), tmp_path / "static.onnx")


@pytest.fixture
def fake_atc(tmp_path, monkeypatch):
    """(path of the stand-in atc, the JSON file it records its argv, cwd and pid in)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    path = folder / "atc"
    path.write_text(FAKE_ATC.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_ATC_RECORD", str(record))
    monkeypatch.delenv("FAKE_ATC_MODE", raising=False)
    return path, record
