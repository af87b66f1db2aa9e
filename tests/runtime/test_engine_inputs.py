"""An Engine call's inputs (found by an independent check of the Python API): a submitted call
reads the caller's arrays when it is made, a scalar input stays a scalar, and a ragged list, None or
an empty batch is refused naming the input, in the server's words."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from aclserve.acl.cpu import faults
from aclserve.runtime import Engine

from tests.tiny_models import affine_reference, affine_request, compile_cpu_om, save_graph

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_submitted_call_is_not_changed_by_the_caller_reusing_its_buffer(affine_om):
    """submit() returns before the rows are packed: the inputs were read from the caller's own
    array then (no copy when the dtype already matched)."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), slots=1)
        gate = threading.Event()
        faults.inject("execute", nth=1, hold=gate, code=0)  # the first run waits: the second is still queued
        req = affine_request(2)
        first = model.submit(affine_request(1))
        second = model.submit(req)
        expected = affine_reference(req["x"].copy(), req["idx"].copy())
        req["x"][:] = -1
        req["idx"][:] = -1
        gate.set()
        first.result(timeout=30)
        np.testing.assert_array_equal(second.result(timeout=30)["s"], expected["s"])


def test_a_scalar_input_stays_a_scalar(tmp_path):
    """np.ascontiguousarray made a 0-d input [1]: a model with a scalar input could not be called."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "sc",
                              [vi("x", TensorProto.FLOAT, [2, 3]), vi("s", TensorProto.FLOAT, [])],
                              [vi("y", TensorProto.FLOAT, [2, 3])])
    save_graph(graph, tmp_path / "scalar.onnx")
    compile_cpu_om(tmp_path / "scalar.onnx", tmp_path / "scalar.om", None)
    with Engine(device="cpu") as engine:
        model = engine.load(tmp_path / "scalar.om")
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(model.infer({"x": x, "s": np.float32(3)})["y"], x * 3)
        with pytest.raises(ValueError, match=r"^input 's': shape \[1\] does not match the model's \[\]$"):
            model.infer({"x": x, "s": np.ones(1, np.float32)})


def test_a_scalar_for_a_batched_input_is_refused_by_its_own_shape(affine_om):
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        with pytest.raises(ValueError, match=r"^input 'x': shape \[\] does not match the model's \[-1, 8\]$"):
            model.infer({"x": np.float32(1), "idx": affine_request(1)["idx"]})


def test_a_ragged_list_or_none_as_an_input_is_refused_naming_the_input(affine_om):
    """A ragged nested list gave numpy's bare "setting an array element with a sequence", naming no
    input, and None "has shape [], expected ['N', 8]" (found by a tester of the Python API; now
    "input 'x': shape [] does not match the model's [-1, 8]", the server's words)."""
    idx = affine_request(1)["idx"]
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        with pytest.raises(ValueError, match=r"^input 'x' is a ragged nested list \(its rows differ in length\)"):
            model.infer({"x": [[0.0] * 8, [0.0] * 7], "idx": affine_request(2)["idx"]})
        with pytest.raises(TypeError, match=r"^input 'x' is None, not an array$"):
            model.infer({"x": None, "idx": idx})


def test_an_empty_batch_is_refused_naming_the_input_as_the_server_does(affine_om):
    """An empty batch raised "inputs have no rows", naming no input, where the server answers 400
    "input 'x': batch dimension must be at least 1" (found by a tester of the Python API)."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        empty = {name: array[:0] for name, array in affine_request(1).items()}
        with pytest.raises(ValueError) as refused:
            model.infer(empty)
    assert str(refused.value) == "input 'x': batch dimension must be at least 1"
