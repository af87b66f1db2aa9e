"""Shapes ONNX Runtime loads and the compile once read otherwise (found by an independent tester):
a dimension stored as a negative dim_value, a graph input or output declaring no shape (or no
type, as onnx-graphsurgeon writes outputs), an input name holding spaces, a model whose only open
dimension is a sequence's length."""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from aclserve.om.shape_args import parse_input_shape
from .acl_runner import acl_context, cpu_acl, run_batch
from .conftest import quiet, run_cli, save


def _relu(path, x_dims, y_dims="same", name="x", y_type=True):
    """x -> Relu -> y, `x_dims` as given (None: no shape field); y declares `y_dims` (None: no
    shape field) and, with y_type False, no type at all."""
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, x_dims)
    y = (helper.make_tensor_value_info("y", TensorProto.FLOAT, x_dims if y_dims == "same" else y_dims)
         if y_type else onnx.ValueInfoProto(name="y"))
    graph = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = save(model, path)
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])  # (ONNX Runtime loads each one)
    return path


def _negative(path, dims):
    """An input whose dims are `dims`, a -1 among them stored as dim_value -1 (a batch so stored:
    ONNX Runtime reads it as dynamic, [None, 4])."""
    model = onnx.load(_relu(path, ["n" if d == -1 else d for d in dims], y_dims=None))
    for d, dim in zip(dims, model.graph.input[0].type.tensor_type.shape.dim):
        if d == -1:
            dim.dim_value = -1
    return save(model, path)


def _io(header):
    return [(t["name"], t["dims"]) for t in header["inputs"]], [(t["name"], t["dims"]) for t in header["outputs"]]


def test_a_batch_stored_as_a_negative_dim_value_is_the_batch(tmp_path):
    """It ended in a TypeError (None * int) in the input's size check; a served folder showed it."""
    src = _negative(tmp_path / "neg.onnx", [-1, 4])
    assert onnx.load(src).graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1
    h = compile_model(src, batch="1,2", target="cpu", log=quiet).header
    assert _io(h) == ([("x", [-1, 4]), ("ascend_mbatch_shape_data", [1])], [("y", [-1, 4])]) and h["gears"] == [1, 2]


def test_a_negative_dim_value_past_the_batch_is_fixed_by_input_shape(tmp_path):
    """["batch", -1] compiled as [N, N] (both the batch symbol), which the server refused; and
    --input-shape x:-1,7 was refused: "the model fixes it at -1"."""
    src = _negative(tmp_path / "neg2.onnx", ["batch", -1])
    with pytest.raises(CompileError, match=r"input 'x' dim 1 is dynamic \(\?\); fix it with --input-shape"):
        compile_model(src, target="cpu", log=quiet)
    h = compile_model(src, input_shape="x:-1,7", batch="1,2", target="cpu", log=quiet).header
    assert _io(h) == ([("x", [-1, 7]), ("ascend_mbatch_shape_data", [1])], [("y", [-1, 7])])
    h = compile_model(_negative(tmp_path / "neg3.onnx", [2, -1]), tmp_path / "neg3.om", input_shape="x:2,5",
                      target="cpu", log=quiet).header
    assert _io(h) == ([("x", [2, 5])], [("y", [2, 5])]) and h["gears"] == []


@pytest.mark.parametrize("lacking", ["shape", "type"])
def test_an_output_declaring_no_shape_or_type_is_inferred_and_probed(tmp_path, lacking):
    """The ONNX checker refused it ("Field 'shape' of 'type' is required but missing"), naming no
    tensor; ONNX Runtime loads it and onnx-graphsurgeon writes outputs so."""
    src = _relu(tmp_path / "m.onnx", ["n", 4], y_dims=None, y_type=lacking != "type")
    result = compile_model(src, batch="1,2", target="cpu", log=quiet)
    assert _io(result.header)[1] == [("y", [-1, 4])] and result.header["outputs"][0]["datatype"] == "FP32"


def test_an_input_declaring_no_shape_takes_input_shape(tmp_path):
    src = _relu(tmp_path / "m.onnx", None, y_dims=["n", 4])
    with pytest.raises(CompileError, match="input 'x' has no shape in the model; give it with --input-shape"):
        compile_model(src, target="cpu", log=quiet)
    h = compile_model(src, input_shape="x:-1,4", batch="1,2", target="cpu", log=quiet).header
    assert _io(h)[0] == [("x", [-1, 4]), ("ascend_mbatch_shape_data", [1])]
    typeless = onnx.load(src)
    typeless.graph.input[0].ClearField("type")
    with pytest.raises(CompileError, match="input 'x' has no data type in the model"):
        compile_model(save(typeless, tmp_path / "t.onnx"), input_shape="x:-1,4", target="cpu", log=quiet)


def test_a_graph_the_checker_refuses_for_another_reason_still_is_refused(tmp_path):
    """What is given for the check is only the missing shape: the checker still sees the rest."""
    model = onnx.load(_relu(tmp_path / "m.onnx", ["n", 4], y_dims=None))
    model.graph.node[0].input[0] = "ghost"  # a node reading a tensor nothing produces
    with pytest.raises(CompileError, match="invalid ONNX graph: .*ghost"):
        compile_model(save(model, tmp_path / "bad.onnx"), target="cpu", log=quiet)


def test_an_output_declaring_no_shape_in_a_model_with_external_data_is_named(tmp_path):
    """The checker reads such a model from its file (to find the data files), so it cannot be
    given the shape: said naming the output, not as the checker's bare sentence."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.data", size_threshold=0)
    with pytest.raises(CompileError, match="output 'y' declares no shape, which the ONNX checker requires of a "
                                           "model with external data"):
        compile_model(tmp_path / "ext.onnx", target="cpu", log=quiet)


def test_input_shape_takes_names_with_spaces(tmp_path):
    """Every space was stripped before matching: "input ids:-1,16" was "unknown input 'inputids'"."""
    assert parse_input_shape(" input ids : -1 , 16 ;b:2") == {" input ids ": [-1, 16], "b": [2]}
    assert parse_input_shape("x:0:-1,4") == {"x:0": [-1, 4]}  # a TF-style name: the dims follow the last ':'
    src = _relu(tmp_path / "m.onnx", ["n", "seq"], name="input ids")
    proc = run_cli("compile", src, "-o", tmp_path / "m.om", "--input-shape", "input ids:-1,16", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(run_cli("inspect", tmp_path / "m.om", "--json").stdout)
    assert info["header"]["inputs"][0]["name"] == "input ids" and info["header"]["inputs"][0]["dims"] == [-1, 16]
    # blanks around the separators still go with them: no input is named " input ids "
    header = compile_model(src, input_shape=" input ids : -1 , 16 ", target="cpu", log=quiet).header
    assert header["inputs"][0]["dims"] == [-1, 16]
    with pytest.raises(CompileError, match=re.escape("--input-shape names input 'input ids' twice")):
        compile_model(src, input_shape="input ids:-1,16; input ids :-1,16", target="cpu", log=quiet)


def test_input_shape_gives_a_scalar_as_a_name_without_dims(tmp_path):
    """A rank-0 input with no shape in the model: the compile asked for --input-shape, and "x:"
    was refused as malformed, though the ATC path writes a declared scalar so (found by a tester)."""
    assert parse_input_shape("x:;x:0:;y : 2") == {"x": [], "x:0": [], "y ": [2]}
    src = _relu(tmp_path / "scalar.onnx", None, y_dims=None)
    with pytest.raises(CompileError, match="input 'x' has no shape in the model; give it with --input-shape"):
        compile_model(src, target="cpu", log=quiet)
    with pytest.raises(CompileError, match="--input-shape gives input 'x' 1 dims; the model has 0"):
        compile_model(_relu(tmp_path / "declared.onnx", []), input_shape="x:1", target="cpu", log=quiet)
    proc = run_cli("compile", src, "-o", tmp_path / "scalar.om", "--input-shape", "x:", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    header = json.loads(run_cli("inspect", tmp_path / "scalar.om", "--json").stdout)["header"]
    assert header["gears"] == [] and header["inputs"][0]["dims"] == [] and header["outputs"][0]["dims"] == []
    assert header["options"]["input_shape"] == "x:"  # (what ATC's --input_shape would be given)
    with acl_context(cpu_acl()):
        assert run_batch(cpu_acl(), str(tmp_path / "scalar.om"), {"x": np.array(-2.5, np.float32)}, None)["y"] == 0
        assert run_batch(cpu_acl(), str(tmp_path / "scalar.om"), {"x": np.array(1.5, np.float32)}, None)["y"] == 1.5


def test_input_shape_names_inputs_exactly_blanks_and_all(tmp_path):
    """Names were stripped: an input " x " or "ü ñ\t" could not be named, and the refusal listed
    the model's inputs unquoted, ("names unknown input 'x' (model inputs:  x )"), the name asked for
    looking like the one listed (found by a tester)."""
    vi = helper.make_tensor_value_info
    inputs = [vi(" x ", TensorProto.FLOAT, ["n", "s"]), vi("ü ñ\t", TensorProto.FLOAT, ["n", "t"])]
    graph = helper.make_graph([helper.make_node("Relu", [" x "], ["y"]), helper.make_node("Neg", ["ü ñ\t"], ["z"])],
                              "g", inputs, [vi("y", TensorProto.FLOAT, None), vi("z", TensorProto.FLOAT, None)])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "blanks.onnx")
    with pytest.raises(CompileError, match=re.escape(
            "--input-shape names unknown input 'x' (model inputs: ' x ', 'ü ñ\\t')")):
        compile_model(src, input_shape="x:-1,3;ü ñ:-1,2", target="cpu", log=quiet)
    proc = run_cli("compile", src, "-o", tmp_path / "blanks.om", "--input-shape", " x :-1,3;ü ñ\t:-1,2",
                   "--batch", "1,2", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    inputs = json.loads(run_cli("inspect", tmp_path / "blanks.om", "--json").stdout)["header"]["inputs"]
    assert [(i["name"], i["dims"]) for i in inputs[:2]] == [(" x ", [-1, 3]), ("ü ñ\t", [-1, 2])]
    unknown = run_cli("compile", src, "-o", tmp_path / "i.om", "--image-input", "x:rgb", "--target", "cpu")
    assert unknown.returncode == 2 and "--image-input names unknown input 'x' (model inputs: ' x ', 'ü ñ\\t')" \
        in unknown.stderr, unknown.stderr


def _pooled(path, ids_dims, other=None) -> str:
    """ids INT64 `ids_dims` -> embeddings [.., 8] -> mean over dimension 0 -> pooled [8] (a sequence
    model without a batch); `other`: the dims of a second input, x, passed through."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["g"]),
             helper.make_node("ReduceMean", ["g", "axis"], ["pooled"], keepdims=0)]
    inputs, outputs = [vi("ids", TensorProto.INT64, ids_dims)], [vi("pooled", TensorProto.FLOAT, [8])]
    if other is not None:
        nodes.append(helper.make_node("Identity", ["x"], ["x_out"]))
        inputs.append(vi("x", TensorProto.FLOAT, other))
        outputs.append(vi("x_out", TensorProto.FLOAT, other))
    inits = [numpy_helper.from_array(np.arange(80, dtype=np.float32).reshape(10, 8), "emb"),
             numpy_helper.from_array(np.array([0], np.int64), "axis")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_a_sequence_taken_for_the_batch_is_said_to_be_fixed_with_input_shape(tmp_path):
    """`ids ["S"]`, pooled to [8]: refused as not batch-major, the message said only `--batch 1`,
    which compiled a model taking one token. Dimension 0 only assumed to be the batch (no --batch,
    no -1 in --input-shape, a symbol not naming a batch): the message gives --input-shape, which
    compiles it."""
    src = _pooled(tmp_path / "seq.onnx", ["S"])
    hint = ("; if dimension 0 is not a batch (a sequence's length, say: --batch 1 would fix it at 1), give its size "
            "instead, e.g. --input-shape \"ids:16\"")
    with pytest.raises(CompileError) as refused:
        compile_model(src, target="cpu", log=quiet)
    assert str(refused.value).endswith("(or compile it for one batch size: --batch 1)" + hint), refused.value
    result = compile_model(src, input_shape="ids:16", target="cpu", log=quiet)
    assert [t["dims"] for t in result.header["inputs"]] == [[16]] and result.header["gears"] == []
    # an input of no batch beside it: refused before the compile runs it, said alike
    with pytest.raises(CompileError) as refused:
        compile_model(_pooled(tmp_path / "two.onnx", ["S"], other=[3, "W"]), target="cpu", log=quiet)
    assert str(refused.value).startswith("input 'x' has no batch dimension first"), refused.value
    assert str(refused.value).endswith(hint), refused.value
    with pytest.raises(CompileError) as refused:
        compile_model(_pooled(tmp_path / "wide.onnx", ["S", 3], other=[2]), target="cpu", log=quiet)
    assert str(refused.value).endswith('--input-shape "ids:16,3"'), refused.value
    # a batch said to be one (by its symbol, --batch or a -1 in --input-shape) gets no such advice
    for ids_dims, options in ((["batch_size"], {}), (["S"], {"batch": "1,2,4"}), (["S"], {"input_shape": "ids:-1"})):
        with pytest.raises(CompileError, match=r"output 'pooled' is not batch-major") as refused:
            compile_model(_pooled(tmp_path / "m.onnx", ids_dims), target="cpu", log=quiet, **options)
        assert str(refused.value).endswith("(or compile it for one batch size: --batch 1)"), refused.value


def test_one_batch_size_a_model_fixes_compiles_as_that_model(tmp_path):
    """`aclserve compile fixed1.onnx --batch 1` on a model of x [1, 4] was refused (no batch
    dimension), where --batch 1 on a dynamic model compiles this same static OM: the size asked
    for is the model's own, so it compiles as the fixed model. Another size, or two, is refused."""
    src = _relu(tmp_path / "fixed.onnx", [1, 4])
    result = compile_model(src, batch="1", target="cpu", log=quiet)
    assert [t["dims"] for t in result.header["inputs"]] == [[1, 4]] and result.header["gears"] == []
    for batch in ("2", "1,2"):
        with pytest.raises(CompileError) as refused:
            compile_model(src, batch=batch, target="cpu", log=quiet)
        assert str(refused.value).startswith("--batch given but the model has no batch dimension"), refused.value


def test_a_model_onnx_runtime_refuses_is_said_once_without_its_coloured_log(tmp_path, capfd):
    """An LSTM of layout 1 (batch first), which ONNX Runtime's CPU kernels refuse: the compile's
    error said it, and ONNX Runtime's own log printed it again on stderr in ANSI colours (in
    `aclserve compile`'s output and the server's log, found by a tester)."""
    hidden, features = 5, 3
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 1, hidden])
    weights = [numpy_helper.from_array(np.ones(shape, np.float32), name) for name, shape in
               (("W", (1, 4 * hidden, features)), ("R", (1, 4 * hidden, hidden)), ("B", (1, 8 * hidden)))]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=hidden, layout=1)
    graph = helper.make_graph([node], "lstm", [x], [y], weights)
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "lstm.onnx")
    capfd.readouterr()
    with pytest.raises(CompileError) as refused:
        compile_model(src, target="cpu", log=quiet)
    assert "(layout == 1) are not supported" in str(refused.value), refused.value
    assert capfd.readouterr().err == ""
