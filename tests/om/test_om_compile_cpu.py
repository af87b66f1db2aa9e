"""The CPU compile path: header contents, and outputs equal to ONNX Runtime on the source model."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import onnxruntime as ort
import pytest

from .acl_runner import acl_context, cpu_acl, run_batch
from aclserve.om import container
from aclserve.om.compile import CompileError, compile_model
from .conftest import multi_io_feeds, quiet, reshape_model, run_cli, save, scalar_output_model, seq_model

GEARS = [1, 3, 8]


def _ort(model_bytes_or_path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes_or_path, so, providers=["CPUExecutionProvider"])


@pytest.fixture
def multi_om(tmp_path, multi_io_onnx):
    return compile_model(multi_io_onnx, tmp_path / "multi.om", batch="1,3,8", target="cpu", log=quiet)


def test_header_describes_inputs_outputs_and_gears(multi_om, multi_io_onnx):
    h = container.read_header(multi_om.path)
    assert multi_om.target == "cpu" and multi_om.size == multi_om.path.stat().st_size
    assert h["name"] == "multi" and h["producer"].endswith(" cpu") and h["created"].endswith("Z")
    with open(multi_io_onnx, "rb") as f:
        assert h["source"] == {"path": multi_io_onnx, "sha256": hashlib.sha256(f.read()).hexdigest()}
    assert h["gears"] == GEARS
    # an input is reported in ATC's --input_format, NCHW for ONNX, whatever its rank (GE's ONNX
    # parser, UpdateDataFormat); the mbatch input ND
    assert [(t["name"], t["datatype"], t["dims"], t["format"]) for t in h["inputs"]] == [
        ("a", "FP32", [-1, 4], "NCHW"), ("b", "INT32", [-1, 3], "NCHW"), ("c", "INT64", [-1, 2], "NCHW"),
        ("d", "FP16", [-1, 5], "NCHW"), ("ascend_mbatch_shape_data", "INT64", [1], "ND")]
    assert h["inputs"][-1]["dynamic_batch"] is True and h["inputs"][-1]["acl_dtype"] == 9
    assert [(t["name"], t["datatype"], t["dims"], t["format"]) for t in h["outputs"]] == [
        ("y_f32", "FP32", [-1, 4], "ND"), ("y_i32", "INT32", [-1, 3], "ND"),
        ("y_i64", "INT64", [-1, 1], "ND"), ("y_f16", "FP16", [-1, 9], "ND")]
    assert h["options"]["target"] == "cpu"


def test_payload_matches_source_for_every_gear(multi_om, multi_io_onnx):
    """Independent of the CPU runtime: the optimised payload computes what the source does."""
    source, compiled = _ort(multi_io_onnx), _ort(container.read(multi_om.path).payload)
    for gear in GEARS:
        feeds = multi_io_feeds(gear)
        for want, got in zip(source.run(None, feeds), compiled.run(None, feeds)):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_cpu_runtime_matches_onnxruntime_for_every_gear(multi_om, multi_io_onnx):
    acl = cpu_acl()
    source = _ort(multi_io_onnx)
    names = [o.name for o in source.get_outputs()]
    with acl_context(acl):
        for gear in GEARS:
            feeds = multi_io_feeds(gear)
            got = run_batch(acl, str(multi_om.path), feeds, gear)
            # the descriptor reports outputs as ATC does: "<node>:<index>:<onnx tensor name>"
            assert [n.rsplit(":", 1)[-1] for n in got["_reported_names"]] == names
            assert all(n.count(":") >= 2 for n in got["_reported_names"])
            for name, want in zip(names, source.run(None, feeds)):
                assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
                np.testing.assert_array_equal(got[name], want)


def test_static_model_has_no_gears_and_no_dynamic_input(tmp_path, static_onnx):
    result = compile_model(static_onnx, target="cpu", log=quiet)
    assert result.path == tmp_path / "static.om"
    h = container.read_header(result.path)
    assert h["gears"] == [] and [t["name"] for t in h["inputs"]] == ["x"]
    assert h["inputs"][0]["dims"] == [2, 3] and h["outputs"][0]["dims"] == [2, 3]
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_ort(container.read(result.path).payload).run(None, {"x": x})[0], np.maximum(x, 0))


def test_input_shape_fixes_a_dynamic_dimension(tmp_path):
    src = save(seq_model(), tmp_path / "seq.onnx")
    with pytest.raises(CompileError, match="'x' dim 1 is dynamic"):
        compile_model(src, target="cpu", log=quiet)
    result = compile_model(src, input_shape="x:-1,7", batch=[2, 4], target="cpu", log=quiet)
    h = result.header
    assert h["inputs"][0]["dims"] == [-1, 7] and h["outputs"][0]["dims"] == [-1, 7] and h["gears"] == [2, 4]


def test_a_batch_marked_past_the_first_dimension_is_said_so(tmp_path):
    """A sequence-first model given -1 where its batch is was told "dim 1 is dynamic; fix it with
    --input-shape", the flag the user had just used (found by an independent check)."""
    src = save(seq_model(), tmp_path / "seq.onnx")
    with pytest.raises(CompileError, match="-1 past its first dimension: -1 marks the batch, which must come first"):
        compile_model(src, input_shape="x:7,-1", target="cpu", log=quiet)


def test_fixed_first_dim_in_input_shape_makes_a_static_model(tmp_path):
    src = save(seq_model(), tmp_path / "seq.onnx")
    h = compile_model(src, input_shape="x:5,7", target="cpu", log=quiet).header
    assert h["gears"] == [] and h["inputs"][0]["dims"] == [5, 7] and len(h["inputs"]) == 1


@pytest.mark.parametrize("gears", ["2,4", "1,4"])
def test_output_shape_unknown_to_inference_is_probed(tmp_path, gears):
    src = save(reshape_model(), tmp_path / "reshape.onnx")
    h = compile_model(src, batch=gears, target="cpu", log=quiet).header
    assert h["outputs"][0]["dims"] == [-1, 8]


def test_a_model_dividing_by_an_input_is_probed_on_ones(tmp_path):
    """An output inference cannot type beside an integer division by an input: the probe run on
    zeros fails ("Integer division by zero") and the model was refused; ones run."""
    from onnx import TensorProto, helper, numpy_helper
    model = reshape_model()
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("d", TensorProto.INT32, ["batch", 1]))
    graph.initializer.append(numpy_helper.from_array(np.array([[8]], np.int32), "eight"))
    graph.node.append(helper.make_node("Div", ["eight", "d"], ["q"]))
    graph.output.append(helper.make_tensor_value_info("q", TensorProto.INT32, ["batch", 1]))
    src = save(model, tmp_path / "divides.onnx")
    result = compile_model(src, batch="2,4", target="cpu", log=quiet)
    assert [o["dims"] for o in result.header["outputs"]] == [[-1, 8], [-1, 1]]
    # said, with what serving it needs: the compile knew and said nothing, and the server's warm-up
    # on zeros then failed (found by a tester)
    (warning,) = result.warnings
    assert warning.startswith("the model cannot run on zeros (a test run on zeros at batch size 2 failed: ")
    assert "Integer division by zero" in warning, warning
    assert warning.endswith("), so its test runs ran on ones: serve it with `warmup_data: ones` in its config (the "
                            "server's warm-up runs every gear on zeros unless told, and would fail)")
    cli = run_cli("compile", src, "-o", tmp_path / "divides.om", "--batch", "2,4", "--target", "cpu")
    assert cli.returncode == 0 and f"\nwarning: {warning}" in cli.stdout, cli.stdout + cli.stderr
    assert compile_model(save(reshape_model(), tmp_path / "reshape.onnx"), target="cpu", log=quiet).warnings == []


def test_a_model_that_cannot_run_at_all_is_refused_at_compile(tmp_path):
    """A sequence set longer than the model's position table (x [N, 10, 4] + the rows 0..9 of an
    [8, 4] table):
    inference let it through, the compile succeeded, and every warm-up run failed, the model
    retried for good as a transient device error (found by a helper; ATC refuses it at compile)."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.zeros((8, 4), np.float32), "positions"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["seq"]),
             helper.make_node("Range", ["zero", "seq", "one"], ["ids"]),
             helper.make_node("Gather", ["positions", "ids"], ["pos"]), helper.make_node("Add", ["x", "pos"], ["y"])]
    graph = helper.make_graph(nodes, "pos", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "seq", 4])], inits)
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "pos.onnx")
    refusal = r"a test run of the model \(on zeros, then ones\) at batch size 1 failed: .*broadcast"
    with pytest.raises(CompileError, match=refusal):
        compile_model(src, batch="1,2", input_shape="x:-1,10,4", target="cpu", log=quiet)
    h = compile_model(src, batch="1,2", input_shape="x:-1,8,4", target="cpu", log=quiet).header
    assert h["outputs"][0]["dims"] == [-1, 8, 4]


def _traced_view(tmp_path, shape_from: str, batch=2) -> str:
    """x.view(x.shape[0], -1) traced at batch 2 without dynamic_axes (a tester's, t96): x [2, 3, 4]
    reshaped to [2, -1] (a Constant node's, as PyTorch's exporter writes it, an initializer, or a
    Concat of constants: computed), then a MatMul with a [12, 5]."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.ones((12, 5), np.float32), "w")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "w"], ["y"])]
    if shape_from == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
            np.array([2, -1], np.int64))))
    elif shape_from == "initializer":
        inits.append(numpy_helper.from_array(np.array([2, -1], np.int64), "shape"))
    else:
        nodes[:0] = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([v], np.int64)))
                     for name, v in (("rows", 2), ("rest", -1))] + [
            helper.make_node("Concat", ["rows", "rest"], ["shape"], axis=0)]
    graph = helper.make_graph(nodes, "view", [vi("x", TensorProto.FLOAT, [batch, 3, 4])],
                              [vi("y", TensorProto.FLOAT, [batch, 5])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / f"{shape_from}.onnx")


@pytest.mark.parametrize("shape_from", ["constant", "initializer", "computed"])
def test_a_batch_the_export_traced_into_a_reshape_is_said(tmp_path, shape_from):
    """Its batch opened with --input-shape, it failed at batch 1 with ONNX Runtime's words only
    ("MatMul dimension mismatch"), which say nothing of the export (a tester, t96). A Reshape whose
    constant shape starts with the exported size is named; a shape computed in the graph is not
    looked into, the hint then general."""
    src = _traced_view(tmp_path, shape_from)
    hint = (r"; the export may have fixed the batch size in a Reshape \(node 'flatten' reshapes to \[2, -1\], 2 the "
            r"batch size of the export, whose dimension 0 --input-shape opened: x\.view\(x\.shape\[0\], \.\.\.\) "
            r"traced\): export it with dynamic_axes / dynamic_shapes naming its batch$")
    if shape_from == "computed":
        hint = (r"; the model was exported at batch size 2, whose dimension 0 --input-shape opened: an export traced "
                r"at one batch size may have fixed it in the graph; export it with dynamic_axes / dynamic_shapes "
                r"naming its batch$")
    with pytest.raises(CompileError, match=r"^a test run of the model \(on zeros, then ones\) at batch size 1 "
                                           r"failed: .*MatMul.*" + hint):
        compile_model(src, input_shape="x:-1,3,4", target="cpu", log=quiet)
    # one batch size other than the export's: ONNX Runtime refuses the static model at load, said so too
    with pytest.raises(CompileError, match=r"^ONNX Runtime cannot load the model: .*" + hint):
        compile_model(src, input_shape="x:-1,3,4", batch="4", target="cpu", log=quiet)
    # at the export's own size it runs: nothing to say
    assert compile_model(src, input_shape="x:-1,3,4", batch="2", target="cpu", log=quiet).header["gears"] == []
    # the batch open in the export itself (dynamic_axes given): --input-shape opened nothing, so a Reshape
    # starting with 2 is the model's own, and ONNX Runtime's refusal is said as it is
    with pytest.raises(CompileError) as refused:
        compile_model(_traced_view(tmp_path, shape_from, batch="N"), target="cpu", log=quiet)
    assert "at batch size 1 failed" in str(refused.value) and "export" not in str(refused.value), refused.value


@pytest.mark.parametrize("declared, input_shape, between", [
    ([1, 3], None, False),  # a fixed-batch export's declared output beside a dynamic input
    (["N", 5], None, False),  # a declared shape the graph does not compute
    ([1, 3], "x:-1,3", False),  # a fixed-batch export made dynamic with --input-shape, as the README says
    ([1, 3], "x:-1,3", True),  # ... with its intermediate values declared [1, 3] too, as torch exports them
], ids=["fixed-batch-output", "wrong-declared", "made-dynamic", "made-dynamic-value-info"])
def test_declared_output_shapes_give_way_to_what_the_graph_computes(tmp_path, declared, input_shape, between):
    """Each compiled (its header taking the declared shape) and then failed every run on the CPU
    runtime ("Got invalid dimensions for output: y"), the model retried for good as a device
    fault (found by an independent check)."""
    from onnx import TensorProto, helper
    first = 1 if input_shape else "N"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Identity", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [first, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)],
                              value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 3])] if between
                              else None)
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    result = compile_model(src, batch=[1, 2, 4], input_shape=input_shape, target="cpu", log=quiet)
    assert result.header["outputs"][0]["dims"] == [-1, 3]
    acl = cpu_acl()
    x = np.arange(-6, 6, dtype=np.float32).reshape(4, 3)
    with acl_context(acl):
        for gear in (2, 4):
            np.testing.assert_array_equal(run_batch(acl, str(result.path), {"x": x[:gear]}, gear)["y"],
                                          np.maximum(x[:gear], 0))


@pytest.mark.parametrize("batch, input_shape, at", [("1,2", None, ", batch size 1"), (None, "x:1,4", "")],
                         ids=["gears", "static"])
def test_an_output_whose_size_follows_the_data_is_refused(tmp_path, batch, input_shape, at):
    """The count of one probe run was compiled in, and every request finding another count failed
    as a device fault, 500 (found by a helper). The operators the ONNX spec sizes by values are
    refused from the graph (test_data_sized.py); an If whose branches give other sizes, chosen by
    the values, is found by the test runs: all four columns on zeros, the first two on ones."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    first_two = helper.make_graph([helper.make_node("Slice", ["x", "start", "two", "columns"], ["some"])], "then", [],
                                  [vi("some", TensorProto.FLOAT, None)])
    every = helper.make_graph([helper.make_node("Identity", ["x"], ["all"])], "else", [],
                              [vi("all", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["kept"], then_branch=first_two, else_branch=every)]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             *(numpy_helper.from_array(np.array([v], np.int64), name) for name, v in
               (("start", 0), ("two", 2), ("columns", 1)))]
    graph = helper.make_graph(nodes, "branches", [vi("x", TensorProto.FLOAT, ["N", 4])],
                              [vi("kept", TensorProto.FLOAT, ["N", "K"])], inits)
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "branches.onnx")
    with pytest.raises(CompileError, match=r"output 'kept' changes size with the input's values \(shape \[1, 4\] on "
                                           r"zeros, \[1, 2\] on ones" + re.escape(at) + r"\): .*TopK"):
        compile_model(src, batch=batch, input_shape=input_shape, target="cpu", log=quiet)
    assert not (tmp_path / "branches.om").exists()


def test_output_without_batch_dimension_is_refused(tmp_path):
    src = save(scalar_output_model(), tmp_path / "scalar.onnx")
    with pytest.raises(CompileError, match=r"output 'y' is not batch-major \(shapes \[\[\](, \[\]){5}\] .*"
                                           r"\(or compile it for one batch size: --batch 1\)"):
        compile_model(src, target="cpu", log=quiet)
    assert not (tmp_path / "scalar.om").exists()


def test_cli_prints_summary(tmp_path, multi_io_onnx):
    out = tmp_path / "cli.om"
    proc = run_cli("compile", multi_io_onnx, "-o", out, "--batch", "1,2", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    for text in ("a: FP32 [N,4]", "d: FP16 [N,5]", "y_i64: INT64 [N,1]", "gears: 1,2", "KiB", " s"):
        assert text in proc.stdout
    assert container.read_header(out)["gears"] == [1, 2]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporaries left


@pytest.mark.parametrize("stem", ["a" * 252, "\u00e9" * 126], ids=["ascii", "two-byte"])
def test_cli_writes_an_output_whose_name_fills_the_filesystems_limit(tmp_path, static_onnx, stem):
    """255 bytes with ".om": the temporary file beside it once took the whole name and 15 bytes
    more (File name too long, for any name past 240 bytes)."""
    out = tmp_path / f"{stem}.om"
    assert len(out.name.encode()) == 255
    proc = run_cli("compile", static_onnx, "-o", out, "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert container.read_header(out)["name"] == stem
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporaries left
    too_long = run_cli("compile", static_onnx, "-o", tmp_path / f"a{stem}.om", "--target", "cpu")
    assert too_long.returncode == 2 and too_long.stderr.rstrip().endswith(".om: File name too long"), too_long


def test_inspect_cpu_om_text_and_json(multi_om):
    text = run_cli("inspect", multi_om.path)
    assert text.returncode == 0, text.stderr
    for fragment in ("cpu_om", "name: multi", "y_f16: FP16 [N,9]", "ascend_mbatch_shape_data: INT64 [1]",
                     "gears: 1,3,8", "sha256"):
        assert fragment in text.stdout
    as_json = run_cli("inspect", multi_om.path, "--json")
    assert as_json.returncode == 0, as_json.stderr
    info = json.loads(as_json.stdout)
    assert info["kind"] == "cpu_om" and info["header"] == container.read_header(multi_om.path)
