"""An output whose size follows the input's values is refused from the graph, before any test
run (om/data_sized.py): a static [1, 4] model's NonZero(x < 5) is [2, 4] on zeros, ones and
normal values alike, compiled so (an independent tester's), and an input [1, 2, 3, 9] then failed
as a device fault, 500, the instance rebuilt."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from .conftest import quiet, run_cli, saved_onnx

vi = helper.make_tensor_value_info


def _below_five(tmp_path, name, after=(), inits=()):
    """where = NonZero(x < 5) of a static x [1, 4], then the nodes `after` (their last output is y)."""
    nodes = [helper.make_node("Less", ["x", "five"], ["below"]), helper.make_node("NonZero", ["below"], ["where"],
                                                                                name="nz")]
    nodes += list(after)
    five = numpy_helper.from_array(np.array(5, np.float32), "five")
    return saved_onnx(tmp_path, name, nodes, [vi("x", TensorProto.FLOAT, [1, 4])],
                      [vi(nodes[-1].output[0], TensorProto.INT64, [2, "K"])], [five, *inits])


def test_an_output_of_nonzero_is_refused_before_any_run_on_both_targets(tmp_path, fake_atc):
    src = _below_five(tmp_path, "hidden")
    out = tmp_path / "hidden.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "error" in line]
    assert ("output 'where' changes size with the input's values: it comes from NonZero (node 'nz'), whose output "
            "size is the count of non-zero values, and ONNX shape inference cannot fix its shape ([2,?]); an OM's "
            "outputs have the sizes fixed when it is compiled; bring the output to a fixed size in the graph (e.g. "
            "TopK with a constant K)") in line, line
    atc, record = fake_atc  # (ATC would build an unknown-shape OM, which the server refuses at load)
    with pytest.raises(CompileError, match=r"output 'where' changes size with the input's values: it comes from "
                                           r"NonZero \(node 'nz'\)"):
        compile_model(src, tmp_path / "c.om", soc_version="Ascend310P3", atc=str(atc), log=quiet)
    assert not record.exists()


def test_an_output_sized_by_an_input_s_values_is_refused(tmp_path):
    """TopK's K, Range's limit: sizes the ONNX spec takes from an input's values; at least 2 or 3
    here, which every value the test runs try gives (zeros, ones, normal values): they compiled."""
    nodes = [helper.make_node("Max", ["k", "two"], ["at_least_two"]),
             helper.make_node("TopK", ["x", "at_least_two"], ["y", "order"], axis=1, name="top")]
    topk = saved_onnx(tmp_path, "topk", nodes, [vi("x", TensorProto.FLOAT, [1, 8]), vi("k", TensorProto.INT64, [1])],
                      [vi("y", TensorProto.FLOAT, [1, 8])], [numpy_helper.from_array(np.array([2], np.int64), "two")])
    with pytest.raises(CompileError, match=r"output 'y' changes size with the input's values: it comes from TopK "
                                           r"\(node 'top'\), whose output size is set by its K, computed from the "
                                           r"values of input 'k'"):
        compile_model(topk, target="cpu", log=quiet)
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
             helper.make_node("Max", ["top", "three"], ["end"]),
             helper.make_node("Range", ["zero", "end", "one"], ["y"], name="count")]
    inits = [numpy_helper.from_array(np.array(v, np.float32), name)
             for name, v in (("zero", 0), ("one", 1), ("three", 3))]
    counting = saved_onnx(tmp_path, "range", nodes, [vi("x", TensorProto.FLOAT, [1, 4])],
                          [vi("y", TensorProto.FLOAT, [3])], inits)
    with pytest.raises(CompileError, match=r"output 'y' changes size with the input's values: it comes from Range "
                                           r"\(node 'count'\), whose output size is set by its start, limit and "
                                           r"delta, computed from the values of input 'x'"):
        compile_model(counting, target="cpu", log=quiet)


def test_a_result_brought_back_to_a_fixed_size_compiles_and_one_sized_from_it_does_not(tmp_path):
    """What shape inference fixes passes: NonZero's positions summed, or the first of them (TopK
    with a constant K); a tensor sized by its count (ConstantOfShape of its Shape) is refused,
    naming NonZero."""
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis")
    summed = _below_five(tmp_path, "summed", [helper.make_node("ReduceSum", ["where", "axis"], ["y"], keepdims=0)],
                         [axis])
    assert compile_model(summed, target="cpu", log=quiet).header["outputs"][0]["dims"] == [2]
    first = _below_five(tmp_path, "first", [helper.make_node("TopK", ["where", "axis"], ["y", "at"], axis=1)], [axis])
    assert compile_model(first, target="cpu", log=quiet).header["outputs"][0]["dims"] == [2, 1]
    sized = _below_five(tmp_path, "sized", [helper.make_node("Shape", ["where"], ["count"]),
                                            helper.make_node("ConstantOfShape", ["count"], ["y"],
                                                             value=helper.make_tensor("one", TensorProto.INT64, [1],
                                                                                      [1]))])
    with pytest.raises(CompileError, match=r"output 'y' changes size with the input's values: it comes from NonZero "
                                           r"\(node 'nz'\)"):
        compile_model(sized, target="cpu", log=quiet)
