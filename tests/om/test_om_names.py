"""Output names as ATC reports them, and the ONNX tensor names clients see."""
from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

from aclserve.om import container
from aclserve.om.names import atc_output_name, atc_output_names, tensor_name
from aclserve.om.spec import CompileError
from aclserve.runtime import Engine
from tests import REPO
from tests.tiny_models import compile_cpu_om, save_graph


def test_tensor_name_of_each_atc_form():
    assert tensor_name("softmax:0:y") == "y"
    assert tensor_name("model/dense:1:out:put") == "out:put"  # a tensor name may hold colons
    assert tensor_name("Add_7:0:dense/BiasAdd:0") == "dense/BiasAdd:0"  # as TF-exported ones do
    assert tensor_name("output_0_Gemm_3_0") == "output_0_Gemm_3_0"  # older CANN: no tensor name left
    assert tensor_name("y") == "y"
    assert tensor_name("n/relu:0:output/Relu:0") == "output/Relu:0"
    assert tensor_name(":0:y") == "y" and tensor_name("n:12:0") == "0"


@pytest.mark.parametrize("node,index,tensor", [
    ("blk:1:relu", 0, "y"),  # a node name holding ":<digits>:" (it was served as "relu:0:y")
    ("x:0", 0, "y"),  # a node named after a TF-style tensor
    ("x:0", 2, "x:0"),
    ("a:1:b:2", 3, "c:d:4"),
])
def test_a_node_name_may_hold_colons_and_digits(node, index, tensor):
    assert tensor_name(atc_output_name(node, index, tensor)) == tensor


def test_an_output_named_by_a_colon_node_is_served_under_its_tensor_name(tmp_path):
    """inspect said y and the server listed "relu:0:y": a request for y was refused (400)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="blk:1:relu"),
             helper.make_node("Neg", ["x"], ["out:0"], name="neg:0")]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["n", 2])],
                              [vi("y", TensorProto.FLOAT, ["n", 2]), vi("out:0", TensorProto.FLOAT, ["n", 2])])
    save_graph(graph, tmp_path / "colon.onnx")
    compile_cpu_om(tmp_path / "colon.onnx", tmp_path / "colon.om", "1,2")
    assert [t["atc_name"] for t in container.read_header(tmp_path / "colon.om")["outputs"]] == [
        "blk:1:relu:0:y", "neg:0:0:out:0"]
    x = np.array([[1, -2]], np.float32)
    with Engine(device="cpu") as engine:
        got = engine.load(tmp_path / "colon.om").infer({"x": x})
    assert sorted(got) == ["out:0", "y"]
    np.testing.assert_array_equal(got["y"], np.maximum(x, 0))


@pytest.mark.parametrize("tensor", ["a:1:b", "5:b"])
def test_an_output_whose_device_name_reads_back_as_another_is_refused(tmp_path, tensor):
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], [tensor], name="r")], "g",
                              [vi("x", TensorProto.FLOAT, ["n", 2])], [vi(tensor, TensorProto.FLOAT, ["n", 2])])
    save_graph(graph, tmp_path / "m.onnx")
    with pytest.raises(CompileError, match=f"output '{tensor}' would be reported by the device as 'r:0:{tensor}', "
                                           "which reads back as 'b': rename the tensor"):
        compile_cpu_om(tmp_path / "m.onnx", tmp_path / "m.om", "1,2")


def test_names_come_from_the_producing_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2]) for n in ("a", "b", "x")]
    nodes = [helper.make_node("Split", ["x"], ["p", "a"], name="split", axis=0, num_outputs=2),
             helper.make_node("Relu", ["x"], ["b"])]  # unnamed: op type and its rank among the unnamed
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs))
    # (ATC's ONNX parser, AdaptAndFindAllOnnxGraph: the counter moves on unnamed nodes only; a
    # graph input passed through is named after its Data node, the input itself)
    assert atc_output_names(model) == {"a": "split:1:a", "b": "Relu_0:0:b", "x": "x:0:x"}


def test_the_shipped_digits_om_reports_the_atc_name():
    header = container.read_header(os.path.join(REPO, "models", "digits.om"))
    assert [(t["name"], t["atc_name"]) for t in header["outputs"]] == [("y", "softmax:0:y")]
