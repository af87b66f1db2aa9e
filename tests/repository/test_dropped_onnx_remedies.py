"""A dropped .onnx the compile cannot serve as it is: its load is refused with a reason naming the
model YAML that fixes it (compile.input_shape, compile.batch), and that YAML serves it."""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.repository import ModelLoadFailed


@pytest.mark.asyncio
async def test_a_dropped_onnx_that_needs_a_shape_is_told_the_yaml_key(make_repo, models_dir):
    """A sequence dimension the compile cannot fix alone: the reason said "fix it with
    --input-shape", a flag of `aclserve compile`, where a dropped model's YAML takes
    compile.input_shape."""
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "seq",
                              [vi("x", TensorProto.FLOAT, ["n", "s"])], [vi("y", TensorProto.FLOAT, ["n", "s"])])
    reason = await _refused_then_served(make_repo, models_dir, "seq", graph, "compile:\n  input_shape: 'x:-1,5'\n")
    assert "fix it with compile.input_shape" in reason and "--input-shape" not in reason, reason


@pytest.mark.asyncio
async def test_a_dropped_onnx_told_to_compile_for_one_batch_size_is_given_valid_yaml(make_repo, models_dir):
    """An output that is not batch-major: the reason said "compile.batch 1", and `batch: 1` is
    refused (a list of integers): it says `compile.batch: [1]`, which serves (found by a helper)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    shape = numpy_helper.from_array(np.array([-1, 6], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "flat",
                              [vi("x", TensorProto.FLOAT, ["n", 10, 6])], [vi("y", TensorProto.FLOAT, ["m", 6])],
                              [shape])
    reason = await _refused_then_served(make_repo, models_dir, "flat", graph, "compile:\n  batch: [1]\n")
    assert "(or compile it for one batch size: compile.batch: [1])" in reason, reason


@pytest.mark.asyncio
async def test_a_dropped_onnx_that_serves_some_batch_sizes_is_told_them_in_yaml(make_repo, models_dir):
    """A Slice capping the batch at 2 rows: the compile test-runs every default size up to 32 and
    names the sizes it serves, `compile.batch: [1,2]` (a `--batch 1,2` read as `[1],2` was no YAML)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], "first2",
                              [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, None)], inits)
    reason = await _refused_then_served(make_repo, models_dir, "first2", graph, "compile:\n  batch: [1,2]\n")
    assert reason.endswith("follows the batch at batch sizes 1, 2 only; compile it for those (compile.batch: [1,2])")


@pytest.mark.asyncio
async def test_a_dropped_onnx_whose_only_open_dimension_is_a_sequence_is_told_to_fix_it(make_repo, models_dir):
    """ids ["S"] pooled to [8]: the reason said only `compile.batch: [1]`, which serves a model
    taking one token; dimension 0 only assumed to be the batch, it names compile.input_shape too,
    which serves it (found by an independent tester)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    emb = numpy_helper.from_array(np.arange(80, dtype=np.float32).reshape(10, 8), "emb")
    graph = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["g"]),
                               helper.make_node("ReduceMean", ["g"], ["pooled"], axes=[0], keepdims=0)], "pool",
                              [vi("ids", TensorProto.INT64, ["S"])], [vi("pooled", TensorProto.FLOAT, [8])], [emb])
    reason = await _refused_then_served(make_repo, models_dir, "pool", graph, "compile:\n  input_shape: 'ids:16'\n")
    assert "not batch-major" in reason and reason.endswith('give its size instead, e.g. compile.input_shape "ids:16"')


@pytest.mark.asyncio
async def test_a_dropped_onnx_whose_rows_depend_on_each_other_is_not_served_as_a_batch_model(make_repo, models_dir):
    """A Softmax over dim 0 was compiled with gears and served: two one-row requests batched
    together were answered 0.835 and 0.165, 1.0 each alone (found by an independent tester)."""
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=0)], "mix",
                              [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("y", TensorProto.FLOAT, ["b", 4])])
    reason = await _refused_then_served(make_repo, models_dir, "mix", graph, "compile:\n  batch: [1]\n")
    assert "rows of input 'x' along the dynamic dimension 0 are not independent" in reason, reason
    assert ("compile it for a static batch (compile.batch: [1]) or fix that dimension with compile.input_shape "
            '"x:SIZE,4"') in reason, reason


async def _refused_then_served(make_repo, models_dir, name: str, graph, remedy: str) -> str:
    """Drop `graph` as NAME.onnx, see its load refused, write the `remedy` YAML the reason names,
    see it serve. Returns the reason."""
    import onnx
    from onnx import helper
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / f"{name}.onnx")
    repo, events = await make_repo(start=False, model_control_mode="explicit")
    await repo.start()
    with pytest.raises(ModelLoadFailed):
        await repo.load(name)
    (row,) = repo.index()
    (models_dir / f"{name}.yaml").write_text(remedy)
    await repo.load(name)
    assert [r["state"] for r in repo.index()] == ["READY"]
    return row["reason"]


@pytest.mark.asyncio
async def test_a_dropped_sequence_first_onnx_is_told_its_batch_must_come_first(make_repo, models_dir):
    """An LSTM's x [T, N, 4]: its load failed as "input 'x' dim 1 is dynamic (batch)" (a tester, t85)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 32, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 32, 8)).astype(np.float32), "R")]
    graph = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=8)], "rnn",
                              [vi("x", TensorProto.FLOAT, ["T", "batch", 4])],
                              [vi("y", TensorProto.FLOAT, ["T", 1, "batch", 8])], inits)
    reason = await _refused_then_served(make_repo, models_dir, "rnn", graph, "compile:\n  input_shape: 'x:16,1,4'\n")
    assert "input 'x' has its batch at dimension 1 (batch; shape [?,?,4]), as a sequence-first model" in reason
    assert reason.endswith('every dimension fixed: compile.input_shape "x:16,1,4" (a request then gives that shape)')
