"""The rewrite of the integer divisions that trap (acl/cpu/_safe_division.py), on the model bytes a
session is built from: what is rewritten, and what is given back as it came (not parsed again nor
written out again). Its answers, served: tests/server/test_integer_division.py."""
from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.acl.cpu._safe_division import rewritten


def _model(nodes, elem_type=TensorProto.INT32, inits=()) -> bytes:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("a", elem_type, ["N", 2]), vi("b", elem_type, ["N", 2])],
                              [vi("y", elem_type, ["N", 2])], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("nodes,elem_type,inits", [
    ([helper.make_node("Add", ["a", "b"], ["y"])], TensorProto.INT32, ()),  # (no Div: not even parsed)
    ([helper.make_node("Div", ["a", "b"], ["y"])], TensorProto.FLOAT, ()),
    ([helper.make_node("Div", ["a", "b"], ["y"])], TensorProto.INT16, ()),  # (promoted to int: no trap)
    ([helper.make_node("Div", ["a", "b"], ["y"])], TensorProto.UINT64, ()),
    ([helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)], TensorProto.INT64, ()),  # (std::fmod: no trap)
    ([helper.make_node("Div", ["a", "two"], ["y"])], TensorProto.INT64,
     [numpy_helper.from_array(np.array([2, -2], np.int64), "two")]),  # (a constant divisor without -1)
])
def test_a_model_without_a_division_that_traps_comes_back_as_it_came(nodes, elem_type, inits):
    model = _model(nodes, elem_type, inits)
    assert rewritten(model) is model


@pytest.mark.parametrize("op,elem_type", [("Div", TensorProto.INT32), ("Div", TensorProto.INT64),
                                          ("Mod", TensorProto.INT32), ("Mod", TensorProto.INT64)])
def test_an_int32_or_int64_division_gets_a_divisor_that_is_never_minus_one(op, elem_type):
    """Mod too: ONNX Runtime 1.32.0's Mod answers INT_MIN % -1 (0), 1.17.3 to 1.31.1 trap on it."""
    vi = helper.make_tensor_value_info
    taken = vi("y_minus_one_aclserve_safe_0", elem_type, [])  # (a name the rewrite would pick: it picks another)
    model = onnx.ModelProto.FromString(_model([helper.make_node(op, ["a", "b"], ["y"], name="divide")], elem_type))
    model.graph.value_info.append(taken)
    safe = onnx.ModelProto.FromString(rewritten(model.SerializeToString()))
    onnx.checker.check_model(safe, full_check=True)
    division = next(n for n in safe.graph.node if n.op_type == op)
    assert division.name == "divide" and division.input[0] == "a" and division.input[1] != "b"
    assert safe.graph.output[0].name == "y"
    ops = [n.op_type for n in safe.graph.node]
    assert ops[:5] == ["Constant", "Equal", "Cast", "Add", "Add"]
    assert ops[6:] == ([] if op == "Mod" else ["Mul", "Sub"])
    constant = numpy_helper.to_array(safe.graph.node[0].attribute[0].t)
    assert constant == -1 and safe.graph.node[0].output[0] != taken.name


def test_divisions_in_subgraphs_and_local_functions_are_rewritten():
    vi = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Div", ["a", "b"], ["q"])], "then", [],
                             [vi("q", TensorProto.INT64, None)])
    orelse = helper.make_graph([helper.make_node("Halve", ["a", "b"], ["r"], domain="local")], "else", [],
                               [vi("r", TensorProto.INT64, None)])
    halve = helper.make_function("local", "Halve", ["x", "d"], ["z"], [helper.make_node("Div", ["x", "d"], ["z"])],
                                 [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=orelse)], "g",
                              [vi("a", TensorProto.INT64, [2]), vi("b", TensorProto.INT64, [2]),
                               vi("c", TensorProto.BOOL, [])], [vi("y", TensorProto.INT64, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[halve])
    model.ir_version = 8
    safe = onnx.ModelProto.FromString(rewritten(model.SerializeToString()))
    branches = {a.name: a.g for a in safe.graph.node[0].attribute}
    for branch in branches.values():
        assert [n.op_type for n in branch.node][-4:] == ["Add", "Div", "Mul", "Sub"], branch
    assert not safe.functions  # (inlined, as ONNX Runtime would)


def test_types_past_onnx_runtime_fusions_are_read_from_its_operator_schemas(tmp_path, caplog):
    """An optimised graph's FusedConv has no type in ONNX's shape inference, nor has what is computed
    from it: its schema says float, so the softmax's Div is left, quietly; Shape's INT64 is not."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Exp", ["r"], ["e"]), helper.make_node("ReduceSum", ["e"], ["s"]),
             helper.make_node("Div", ["e", "s"], ["y"]), helper.make_node("Shape", ["r"], ["shape"]),
             helper.make_node("Div", ["shape", "k"], ["z"])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["N", 1, 2, 2]), vi("k", TensorProto.INT64, [4])],
                              [vi("y", TensorProto.FLOAT, None), vi("z", TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # (as the CPU compile)
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimised = onnx.load(options.optimized_model_filepath)
    assert "FusedConv" in [n.op_type for n in optimised.graph.node]
    with caplog.at_level(logging.WARNING, logger="aclserve.acl.cpu"):
        safe = onnx.ModelProto.FromString(rewritten(optimised.SerializeToString()))
    assert not caplog.records
    divisions = [n for n in safe.graph.node if n.op_type == "Div"]
    assert [n.input[0] for n in divisions] == ["shape", "e"] and divisions[0].input[1] != "k"
    assert divisions[1].input[1] == "s"


def test_a_cast_tells_the_type_past_an_operator_nothing_knows():
    nodes = [helper.make_node("Opaque", ["a"], ["t"], domain="custom"), helper.make_node("Cast", ["t"], ["c"], to=7),
             helper.make_node("Div", ["c", "c"], ["u"]), helper.make_node("Opaque", ["u", "b"], ["y"], domain="custom")]
    safe = onnx.ModelProto.FromString(rewritten(_model(nodes)))
    assert "Equal" in [n.op_type for n in safe.graph.node]
    assert numpy_helper.to_array(next(n for n in safe.graph.node if n.op_type == "Constant").attribute[0].t).dtype \
        == np.int64


def test_a_division_whose_type_is_not_known_is_left_and_named_in_a_warning(caplog):
    """(Its operands come from an operator ONNX's shape inference does not know.)"""
    nodes = [helper.make_node("Opaque", ["a"], ["t"], domain="custom"), helper.make_node("Div", ["t", "t"], ["u"],
                                                                                         name="unknowable"),
             helper.make_node("Opaque", ["u", "b"], ["y"], domain="custom")]
    model = _model(nodes)
    with caplog.at_level(logging.WARNING, logger="aclserve.acl.cpu"):
        assert rewritten(model) is model
    assert "'unknowable'" in caplog.text and "element type is not known" in caplog.text
