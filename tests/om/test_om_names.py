"""Output names as ATC reports them, and the ONNX tensor names clients see."""
from __future__ import annotations

import os

from onnx import TensorProto, helper

from aclserve.om import container
from aclserve.om.names import atc_output_names, tensor_name
from tests import REPO


def test_tensor_name_of_each_atc_form():
    assert tensor_name("softmax:0:y") == "y"
    assert tensor_name("model/dense:1:out:put") == "out:put"  # a tensor name may hold colons
    assert tensor_name("Add_7:0:dense/BiasAdd:0") == "dense/BiasAdd:0"  # as TF-exported ones do
    assert tensor_name("output_0_Gemm_3_0") == "output_0_Gemm_3_0"  # older CANN: no tensor name left
    assert tensor_name("y") == "y"


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
