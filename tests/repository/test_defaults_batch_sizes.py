"""model_defaults' compile.batch, meant for every model: an .onnx without a batch dimension compiles
without it (said in an INFO line), where a model's own compile.batch on such a model fails its load."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.repository import State
from tests.tiny_models import save_graph, scale_onnx

from .repo_helpers import serving

pytestmark = pytest.mark.asyncio

PASSED_OVER = ("model_defaults' compile.batch [1, 2, 4] passed over: the model has no batch dimension (no input has a "
               "dynamic first dimension), so it compiled without batch sizes")


def fixed_matmul_onnx(path) -> str:
    """y = x @ ones: x FP32 [1, 4] (fixed) -> y [1, 2]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    weights = numpy_helper.from_array(np.ones((4, 2), np.float32), "W")
    return save_graph(helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "fixed", [x], [y],
                                        [weights]), path)


def rank0_output_onnx(path) -> str:
    """s = the sum of x: x FP32 [3] -> s FP32 [] (no dimension to batch on either side)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [])
    node = helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)
    return save_graph(helper.make_graph([node], "sum", [x], [s]), path)


async def test_model_defaults_batch_sizes_pass_over_a_model_without_a_batch_dimension(make_repo, models_dir,
                                                                                       caplog):
    """A tester's `model_defaults: {compile: {batch: [1, 2, 4]}}` made a fixed [1, 4] MatMul and a
    model of a rank-0 output UNAVAILABLE (`compile.batch given but the model has no batch
    dimension`), while a dynamic-batch model took the sizes: each such model compiles without them,
    named in an INFO line, the dynamic one still takes them, and a model whose own YAML gives them
    is still refused."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    fixed_matmul_onnx(models_dir / "fixed.onnx")
    rank0_output_onnx(models_dir / "sum.onnx")
    scale_onnx(models_dir / "dyn.onnx", 2.0)
    fixed_matmul_onnx(models_dir / "own.onnx")
    (models_dir / "own.yaml").write_text("compile: {batch: [1, 2]}\n")
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.compile.batch": [1, 2, 4]})
    assert serving(repo) == ["dyn", "fixed", "sum"]
    index = {r["name"]: (r["state"], r["reason"]) for r in repo.index()}
    assert index["own"][0] == State.UNAVAILABLE
    assert "compile.batch given but the model has no batch dimension" in index["own"][1]
    assert repo.get("dyn").gears == (1, 2, 4) and repo.get("fixed").gears == () == repo.get("sum").gears
    said = sorted(r.getMessage() for r in caplog.records if "compile.batch" in r.getMessage() and "passed" in
                  r.getMessage())
    assert said == [f"fixed:1: {PASSED_OVER}", f"sum:1: {PASSED_OVER}"]
    answer = await repo.get("fixed").infer({"x": np.arange(4, dtype=np.float32).reshape(1, 4)}, 1)
    assert answer.outputs["y"].tolist() == [[6.0, 6.0]]
    answer = await repo.get("sum").infer({"x": np.array([1, 2, 3], np.float32)}, 1)
    assert answer.outputs["s"].tolist() == 6.0
