"""model_defaults' compile.batch, meant for every model: an .onnx without a batch dimension compiles
without it (said in an INFO line), where a model's own compile.batch on such a model fails its load."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.repository import State
from tests.tiny_models import save_graph, scale_onnx

from .repo_helpers import serving, write_in

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


# the compile's refusal of a model's own sizes for a model without a batch dimension, in the config's words
OWN_REFUSED = ("compile.batch given but the model has no batch dimension (no input has a dynamic first dimension; -1 "
               "marks it in compile.input_shape)")


async def test_own_batch_sizes_finding_the_defaults_compile_in_the_cache_are_refused(make_repo, models_dir,
                                                                                     tmp_path, caplog):
    """The cache key names no origin of the sizes (a review, r33: it did, and every .onnx under model_defaults'
    compile.batch, dynamic ones too, compiled again on the upgrade): the same sizes given in a model's own
    YAML find the entry compiled without them under model_defaults', and the load refuses it as the compile
    refuses a model's own sizes, without a compile."""
    from aclserve.repository.compiler import cache_key
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    fixed_matmul_onnx(models_dir / "fixed.onnx")
    scale_onnx(models_dir / "dyn.onnx", 2.0)
    repo, events = await make_repo(compile_cache_dir=str(tmp_path / "cache"), **{"model_defaults.compile.batch":
                                                                                 [1, 2, 4]})
    assert serving(repo) == ["dyn", "fixed"]
    dyn = repo.get("dyn")  # (its key, and its entry's name, as before model_defaults' sizes could be passed over)
    key = cache_key(models_dir / "dyn.onnx", dyn.config.compile, "cpu")
    assert os.path.basename(dyn.om_path) == f"dyn-{key[:32]}.om"
    caplog.clear()
    write_in(models_dir / "fixed.yaml", "compile: {batch: [1, 2, 4]}\n")
    await events.wait("load_failed", "fixed")
    ((state, reason),) = [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "fixed"]
    assert state == State.READY and reason == f"serving the previous config; the new one failed: {OWN_REFUSED}"
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]  # (the entry found: no compile)
    assert repo.get("fixed").gears == ()


async def test_a_config_pbtxts_own_max_batch_size_is_refused_before_a_compile(make_repo, models_dir, caplog):
    """A config.pbtxt's own max_batch_size over 0 on a model without a batch dimension asks for what the
    model has not: refused in its words as its compile begins, before the model is built (it compiled in
    full first, under model_defaults' compile.batch: a review, r33)."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    fixed_matmul_onnx(models_dir / "one.onnx")
    (models_dir / "static" / "1").mkdir(parents=True)
    os.replace(models_dir / "one.onnx", models_dir / "static" / "1" / "model.onnx")
    write_in(models_dir / "static" / "config.pbtxt", "max_batch_size: 4\n")
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.compile.batch": [1, 2, 4]})
    ((state, reason),) = [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "static"]
    assert state == State.UNAVAILABLE and reason.startswith("config.pbtxt: max_batch_size 4 cannot apply: the model "
                                                            "has no batch dimension (no input has a dynamic first "
                                                            "dimension, so it compiles without batch sizes)"), reason
    assert not [r for r in caplog.records if "compiled in" in r.getMessage()]  # (refused as its compile began)
