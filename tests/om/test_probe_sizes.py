"""The CPU compile's test runs of a dynamic batch take small batch sizes whatever sizes are compiled
(om/probe_sizes.py). They ran at the two smallest sizes (so at the largest of two):
`compile: {batch: [1, 1073741824]}` fed 2**30 rows of x [N, 4] FP32, 16 GiB and half a minute,
for a model whose load is then refused for memory. At 2**40 rows (16 TiB) the feed cannot be
allocated at all: such a compile failed ("a test run of the model ... failed: Unable to allocate
16.0 TiB"). A size is now at most 2048 (om/gears.py); the runs stay at 32 rows at most."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from aclserve.om.gears import MAX_BATCH_SIZE
from .conftest import quiet, save, saved_onnx, scalar_output_model

HUGE = MAX_BATCH_SIZE  # rows: the largest size a compile takes (it was 2**40: x [N, 4] FP32 of 16 TiB)


def _onnx(tmp_path, name, nodes, outputs, inits=(), dtype=TensorProto.FLOAT):
    """x FP32 [N, 4] -> `outputs` of `dtype` (their shapes left to the compile)."""
    vi = helper.make_tensor_value_info
    weights = [numpy_helper.from_array(np.asarray(value), key) for key, value in inits]
    graph = helper.make_graph(nodes, name, [vi("x", TensorProto.FLOAT, ["N", 4])],
                              [vi(o, dtype, None) for o in outputs], weights)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / f"{name}.onnx")


def _dims(path, batch):
    return [o["dims"] for o in compile_model(path, batch=batch, target="cpu", log=quiet).header["outputs"]]


def test_a_dynamic_batch_is_tried_at_small_sizes_whatever_the_largest(tmp_path):
    relu = _onnx(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"])], ["y"])
    header = compile_model(relu, batch=[1, HUGE], target="cpu", log=quiet).header
    assert header["gears"] == [1, HUGE] and [o["dims"] for o in header["outputs"]] == [[-1, 4]]
    assert _dims(relu, [HUGE - 1, HUGE]) == [[-1, 4]]  # (tried at 1 and 2 rows)
    # the batch-major check still runs at two sizes: an output without the batch is refused as it was
    with pytest.raises(CompileError, match=r"output 'y' is not batch-major \(shapes \[\[\], \[\]\] for batch sizes "
                                           r"\[1, 2\]\)"):
        compile_model(save(scalar_output_model(), tmp_path / "scalar.onnx"), batch=[1, HUGE], target="cpu",
                      log=quiet)


def test_a_model_that_runs_rows_in_pairs_compiles_with_one_small_size(tmp_path):
    """Rows reshaped into pairs run at even batch sizes only: with sizes [2, 64] the test runs
    took 2 and one row more, 3, and refused a model ATC compiles (a reviewer's); a multiple of
    the small size (4) runs as the sizes asked for do."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Reshape", ["x", "pairs"], ["p"]), helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("Reshape", ["r", "rows"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "pairs"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "rows")]
    pairs = saved_onnx(tmp_path, "pairs", nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       inits)
    assert _dims(pairs, [2, 64]) == [[-1, 4]]


def _first_rows(tmp_path, rows: int = 2) -> str:
    """y = x[:rows] (a Slice of dimension 0): a model that runs at every batch size and follows
    the batch only up to `rows` rows."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    inits = [("starts", np.array([0], np.int64)), ("ends", np.array([rows], np.int64)),
             ("axes", np.array([0], np.int64))]
    return _onnx(tmp_path, "first2", nodes, ["y"], inits)


def test_every_small_size_compiled_is_test_run(tmp_path):
    """A Slice capping the batch at 2 rows compiled for 1,2,4: the test runs took 1 and 2 only, and
    the server's warm-up at 4 failed, retried for good as a device fault (found by a tester). Every
    size up to PROBE_ROWS now runs, and the refusal names the sizes the model serves."""
    first2 = _first_rows(tmp_path)
    with pytest.raises(CompileError, match=re.escape(
            "output 'y' does not follow the batch at batch size 4 (shapes [[1, 4], [2, 4], [2, 4]] for batch sizes "
            "[1, 2, 4]): it follows the batch at batch sizes 1, 2 only; compile it for those (--batch 1,2)")):
        compile_model(first2, batch=[1, 2, 4], target="cpu", log=quiet)
    with pytest.raises(CompileError, match=r"does not follow the batch at batch size 4 .* sizes 1, 2 only; "):
        compile_model(first2, target="cpu", log=quiet)  # (the default sizes, 1 to 32)
    with pytest.raises(CompileError, match=r"at batch size 32 \(.*: it follows the batch at batch sizes 1, 2, 4, "
                                           r"8, 16 only; compile it for those \(--batch 1,2,4,8,16\)"):
        compile_model(_first_rows(tmp_path, 16), target="cpu", log=quiet)
    assert _dims(first2, [1, 2]) == [[-1, 4]]


def test_a_test_run_that_fails_names_the_size_it_failed_at(tmp_path):
    """Rows reshaped into pairs fail at an odd size: ONNX Runtime's reason is said with the size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Reshape", ["x", "pairs"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1, 8], np.int64), "pairs")]
    pairs = saved_onnx(tmp_path, "pairs8", nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       inits)
    with pytest.raises(CompileError, match=r"a test run of the model \(on zeros, then ones\) at batch size 3 failed "
                                           r"\(batch sizes 2 ran\): .*cannot be reshaped"):
        compile_model(pairs, batch=[2, 3, 4], target="cpu", log=quiet)
