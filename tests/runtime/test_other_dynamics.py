"""Only batch gears are served: an OM with another kind of dynamic input (image size, dims, a
dynamic shape, dynamic AIPP) is refused at load naming what it has, not left to fail as a slot
buffer that cannot be laid out (a numpy error, before). The OMs are written as the CPU compiler
would, from graphs it refuses to compile (it fixes every dimension but the batch). Not here: an
OM of dynamic image size or dims (ATC's mbatch input without batch gears), which a CPU OM cannot
be (the CPU runtime refuses the file itself); OmModel refuses it by that input's name.

And every output of a gear model must keep its batch first: the device reports an output at the
largest gear, not with -1 (batch_axes.py), so a sequence-first output or one without a batch
was taken as batch-major and split by rows (other rows' values in an answer, no error). Nor
may an input of a gear model be fixed: ATC compiles `--dynamic_batch_size` with an input that
has no -1 left as it is, and the batcher filled its dimension 0 with the requests' rows (wrong
answers when its fixed size was the largest gear, a numpy error at load otherwise)."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from aclserve.runtime import open_pool
from aclserve.runtime.device import LoadError

from tests.contract.conftest import write_cpu_om


def relu(path, dims, name="x", gears=(1, 2)):
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", [name], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return write_cpu_om(path, model, list(gears) if gears else None)


@pytest.mark.parametrize("dims, name, gears, message", [
    (["N", 3, "H", "W"], "x", (1, 2), "tensor 'x' has the shape [-1, 3, -1, -1]; only the batch dimension"),
    ([1, 3, 8, 8], "ascend_dynamic_aipp_data", None, "takes dynamic AIPP (ascend_dynamic_aipp_data)"),
    # a gear model's dynamic-AIPP input is fixed (GE gives it no batch): named for what it is
    ([64], "ascend_dynamic_aipp_data", (1, 2), "takes dynamic AIPP (ascend_dynamic_aipp_data)"),
])
def test_an_om_with_other_dynamic_inputs_is_refused_naming_them(runtime, tmp_path, dims, name, gears, message):
    om = relu(tmp_path / "m.om", dims, name, gears)
    ledger = runtime.device(0).ledger
    before = (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"])
    with pytest.raises(LoadError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        open_pool(runtime, om, "m")
    assert (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"]) == before  # nothing kept


def test_an_om_of_batch_gears_alone_still_loads(runtime, tmp_path):
    pool = open_pool(runtime, relu(tmp_path / "m.om", ["N", 3, 8, 8]), "m")
    try:
        assert pool.gears == (1, 2) and pool.inputs[0].shape == (-1, 3, 8, 8)
    finally:
        pool.close()


def output_of(path, kind, gears=(1, 2)):
    """x [N, 3, 4] -> y: sequence-first [3, N, 4] (transposed) or without a batch [3, 4] (summed
    over it), as a CPU OM would describe them (the CPU compiler refuses both)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])
    if kind == "transposed":
        node = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "N", 4])
    else:
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [0])] if kind == "summed" else []
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return write_cpu_om(path, model, list(gears))


@pytest.mark.parametrize("kind, dims", [("transposed", "[[3, 1, 4], [3, 2, 4]]"), ("summed", "[[3, 4], [3, 4]]")])
def test_an_output_without_its_batch_first_is_refused_at_load(runtime, tmp_path, kind, dims):
    om = output_of(tmp_path / "m.om", kind)
    ledger = runtime.device(0).ledger
    before = (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"],
              runtime.acl.memory_stats(0)["allocations"])
    message = f"output 'y' is not batch-major (dims {dims} at batch sizes [1, 2])"
    with pytest.raises(LoadError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        open_pool(runtime, om, "m")
    after = (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"],
             runtime.acl.memory_stats(0)["allocations"])
    assert after == before  # nothing kept, the probe's dataset and memory included


def with_fixed_input(path, fixed_rows, gears):
    """x [N, 4] + the sum of s [fixed_rows, 4] over its rows -> y [N, 4], as ATC would describe
    it (s keeps its fixed dims; the CPU compiler refuses such a model)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [fixed_rows, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("ReduceSum", ["s"], ["t"], keepdims=1), helper.make_node("Add", ["x", "t"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, s], [y]), opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return write_cpu_om(path, model, list(gears))


@pytest.mark.parametrize("gears", [(1, 2), (1, 2, 4)])  # its rows the largest gear (was served wrongly), or not
def test_a_fixed_input_of_a_gear_model_is_refused_at_load(runtime, tmp_path, gears):
    om = with_fixed_input(tmp_path / "m.om", 2, gears)
    ledger = runtime.device(0).ledger
    before = (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"])
    with pytest.raises(LoadError, match=r"input 's' has the shape \[2, 4\] in a model of batch gears"):
        open_pool(runtime, om, "m")
    assert (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"]) == before
