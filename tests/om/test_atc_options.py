"""What ATC would refuse among a compile's options (om/atc_options.py): an independent tester
compiled `--precision-mode bogus`, `--soc-version Bogus123` and opsets 7 and 28 to CPU OMs without
a word, and operators of com.microsoft and ai.onnx.ml, which ATC has no parser for. A precision mode
outside ATC's list is refused on both targets; a SoC or an opset ATC may refuse is a warning in
the CPU compile's summary; an operator outside the ONNX domain is refused by the CPU compile and
left to ATC (a custom op plugin may parse it)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om import container
from aclserve.om.compile import CompileError, compile_model
from .conftest import run_cli, save


def _relu(path, opset: int = 17, ir: int = 9) -> str:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [vi("x", TensorProto.FLOAT, ["b", 4])],
                              [vi("y", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = save(model, path)
    if ir != 9:  # (save sets IR 9; a newer opset needs a newer IR)
        model.ir_version = ir
        onnx.save(model, path)
    return path


@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_a_precision_mode_atc_does_not_take_is_refused_on_both_targets(tmp_path, fake_atc, target):
    atc, record = fake_atc
    src = _relu(tmp_path / "relu.onnx")
    args = ["--atc", atc] if target == "npu" else ["--target", "cpu"]
    proc = run_cli("compile", src, "--precision-mode", "bogus", "--soc-version", "Ascend310P3", *args)
    assert proc.returncode == 2 and proc.stdout == "" and not (tmp_path / "relu.om").exists()
    assert proc.stderr.strip() == (
        "aclserve compile: error: --precision-mode 'bogus' is not one ATC takes: force_fp16, force_fp32, "
        "cube_fp16in_fp32out, allow_fp32_to_fp16, must_keep_origin_dtype, allow_mix_precision, "
        "allow_mix_precision_fp16, allow_mix_precision_bf16, allow_fp32_to_bf16")
    assert not record.exists()  # ATC never ran
    for mode in ("must_keep_origin_dtype", "allow_fp32_to_bf16"):  # the list's values still compile
        result = compile_model(src, precision_mode=mode, soc_version="Ascend310P3", target=target,
                               atc=str(atc) if target == "npu" else None, log=lambda _: None)
        assert result.warnings == []


def test_a_soc_or_an_opset_atc_would_refuse_is_a_warning_in_the_cpu_summary(tmp_path):
    out = tmp_path / "m.om"
    proc = run_cli("compile", _relu(tmp_path / "old.onnx", opset=7), "-o", out, "--target", "cpu",
                   "--soc-version", "Bogus123")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == [
        "warning: --soc-version 'Bogus123' does not look like a SoC ATC takes (`Ascend` and the chip's name from "
        "npu-smi, e.g. Ascend310P3, Ascend910B1): ATC would refuse it",
        "warning: the model imports ONNX opset 7; ATC takes opsets 11 to 18 (older CANN fewer: 8.0 takes 11 to 15): "
        "ATC would refuse it; convert it (onnx.version_converter)"]
    proc = run_cli("compile", _relu(tmp_path / "new.onnx", opset=28, ir=13), "-o", out, "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("warning:")] == [
        "warning: the model imports ONNX opset 28; ATC takes opsets 11 to 18 (older CANN fewer: 8.0 takes 11 to 15): "
        "ATC would refuse it; convert it (onnx.version_converter)"]
    for soc, opset in (("Ascend310P3", 11), ("Ascend910B4", 18), ("Ascend910_9392", 17), (None, 17)):
        assert compile_model(_relu(tmp_path / "ok.onnx", opset=opset), out, soc_version=soc, target="cpu",
                             log=lambda _: None).warnings == [], (soc, opset)


def test_the_cpu_summary_notes_a_precision_mode_the_cpu_runtime_does_not_apply(tmp_path):
    """A CPU OM records ATC's default force_fp16 while the CPU runtime computes in fp32: y = x + x
    of 70000 is 140000 here and inf on an NPU, and only `compile --help` said so."""
    src, out = _relu(tmp_path / "relu.onnx"), tmp_path / "m.om"
    notes = {}
    for mode in (None, "allow_fp32_to_fp16", "must_keep_origin_dtype"):
        proc = run_cli("compile", src, "-o", out, "--target", "cpu", *(["--precision-mode", mode] if mode else []))
        assert proc.returncode == 0, proc.stderr
        notes[mode] = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert notes[None] == [
        "note: precision_mode force_fp16 is recorded for ATC, not applied: the CPU runtime computes in the model's "
        "own types (its FP32 operators in fp32); on an NPU force_fp16 runs every operator that has an fp16 kernel "
        "in fp16, so answers may differ (past 65504, fp16's largest: inf); --precision-mode must_keep_origin_dtype "
        "keeps the model's types there too"]
    assert notes["allow_fp32_to_fp16"] and "matrix operators (MatMul, Conv) in fp16" in notes["allow_fp32_to_fp16"][0]
    assert notes["must_keep_origin_dtype"] == []  # (the CPU runtime does what it says)


def _int32_add(path, through_fp32: bool = False, dtype: int = TensorProto.INT32) -> str:
    """y = x + x of INT32 (or `dtype`), or (through_fp32) y = x + Cast(ConstantOfShape(Shape(x))),
    whose zeros are FP32 by ConstantOfShape's default: an FP32 operator only shape inference finds."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["x", "x"], ["y"])]
    if through_fp32:
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ConstantOfShape", ["s"], ["z"]),
                 helper.make_node("Cast", ["z"], ["zi"], to=dtype),
                 helper.make_node("Add", ["x", "zi"], ["y"])]
    graph = helper.make_graph(nodes, "add", [vi("x", dtype, ["b", 4])], [vi("y", dtype, ["b", 4])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _notes(src, out) -> list[str]:
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("note:")]


def test_the_precision_note_names_fp32_operators_only_for_a_model_that_has_them(tmp_path):
    """An INT32 model's note said "(its FP32 operators in fp32)" too (a tester's walk of the README),
    then that its answers "may differ" on an NPU, where a precision mode changes none of its types.
    An FP16 model's may (force_fp32 computes matrix operators on fp16 inputs in fp32 there), but not
    by fp16's overflow past 65504, which it meets on the CPU runtime as well."""
    assert _notes(_int32_add(tmp_path / "add.onnx"), tmp_path / "add.om") == [
        "note: precision_mode force_fp16 is recorded for ATC, not applied: the model has no floating-point tensors "
        "(integers or booleans only), the only ones a precision mode acts on, so it changes none of the model's "
        "types on an NPU either"]
    assert _notes(_int32_add(tmp_path / "half.onnx", dtype=TensorProto.FLOAT16), tmp_path / "half.om") == [
        "note: precision_mode force_fp16 is recorded for ATC, not applied: the CPU runtime computes in the model's "
        "own types; on an NPU force_fp16 runs every operator that has an fp16 kernel in fp16, so answers may differ; "
        "--precision-mode must_keep_origin_dtype keeps the model's types there too"]
    for src, fp32, floats in ((_int32_add(tmp_path / "zeros.onnx", through_fp32=True), True, True),
                              (_relu(tmp_path / "r.onnx"), True, True),
                              (_int32_add(tmp_path / "add.onnx"), False, False),
                              (_int32_add(tmp_path / "h.onnx", dtype=TensorProto.FLOAT16), False, True),
                              (_int32_add(tmp_path / "i64.onnx", dtype=TensorProto.INT64), False, False)):
        compiled = compile_model(src, tmp_path / "m.om", target="cpu", log=lambda _: None)
        assert (compiled.fp32_operators, compiled.float_operators) == (fp32, floats), src


def test_a_bf16_precision_note_claims_no_fp16_overflow():
    """bf16 keeps fp32's range: its note said "past 65504, fp16's largest: inf" too."""
    from aclserve.om.describe import precision_note
    (bf16,) = precision_note({"options": {"precision_mode": "allow_fp32_to_bf16"}})
    assert "matrix operators in bf16, so answers may differ; --precision-mode" in bf16 and "65504" not in bf16


def test_an_opset_of_cann_s_parsers_but_not_of_its_documents_may_be_refused(tmp_path):
    """CANN's ONNX op plugins register parsers for opsets 8 to 10 for many operators ("ai.onnx::8::Conv"),
    though its documents say 11: "would refuse" was not true of them."""
    proc = run_cli("compile", _relu(tmp_path / "nine.onnx", opset=9, ir=4), "-o", tmp_path / "m.om", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("warning:")] == [
        "warning: the model imports ONNX opset 9; ATC may refuse it: CANN documents opsets 11 to 18, though its "
        "parsers take opset 9 for many operators; convert it (onnx.version_converter) to be sure"]


def _foreign(path, ops=(("com.microsoft", "Gelu"),), where: str = "graph") -> str:
    """x [b, 4] -> the operators `ops` ((domain, type), one after another) -> out: in the graph, in
    the then branch of an If (`where` "if") or in the body of a Loop ("loop")."""
    vi = helper.make_tensor_value_info
    attrs = {"Scaler": {"offset": [1.0] * 4, "scale": [2.0] * 4}}
    names = ["x"] + [f"t{i}" for i in range(1, len(ops))] + ["y" if where != "graph" else "out"]
    chain = [helper.make_node(op, [a], [b], domain=domain, **attrs.get(op, {}))
             for (domain, op), a, b in zip(ops, names, names[1:])]
    y = [vi("y", TensorProto.FLOAT, ["b", 4])]
    if where == "if":
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "else", [],
                                  [vi("z", TensorProto.FLOAT, ["b", 4])])
        nodes = [helper.make_node("If", ["flag"], ["out"], then_branch=helper.make_graph(chain, "then", [], y),
                                  else_branch=other)]
    elif where == "loop":
        body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"])] + chain, "body",
                                 [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, [])],
                                 [vi("cond_out", TensorProto.BOOL, [])] + y)
        nodes = [helper.make_node("Loop", ["one", ""], ["out"], body=body)]
    else:
        nodes = chain
    inits = [numpy_helper.from_array(np.array(True), "flag"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("out", TensorProto.FLOAT, None)],
                              inits)
    domains = sorted({domain for domain, _ in ops})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)] + [
        helper.make_opsetid(d, 3 if d == "ai.onnx.ml" else 1) for d in domains])
    return save(model, path)


@pytest.mark.parametrize("where", ["graph", "if", "loop"])
def test_an_operator_outside_the_onnx_domain_is_refused_by_the_cpu_compile(tmp_path, where):
    """com.microsoft's Gelu (ONNX Runtime's transformer optimiser) and ai.onnx.ml's Scaler (skl2onnx)
    compiled and served: ATC refuses them (E19010, no parser registered), in a subgraph too."""
    src = _foreign(tmp_path / "m.onnx", (("com.microsoft", "Gelu"), ("ai.onnx.ml", "Scaler")), where)
    proc = run_cli("compile", src, "--target", "cpu")
    assert proc.returncode == 2 and "compiling" not in proc.stdout, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == (
        "aclserve compile: error: the model uses operators outside the ONNX domain (com.microsoft:Gelu, "
        "ai.onnx.ml:Scaler), for which ATC has no parser (E19010 \"No parser is registered for Op\"), so the CPU "
        "compile refuses them too: export the model again without contrib or ML operators (ONNX Runtime's "
        "transformer optimiser writes com.microsoft ones, skl2onnx ai.onnx.ml ones), or compile it with ATC on an "
        "NPU host that has a custom op plugin for them")
    assert not (tmp_path / "m.om").exists()


def test_a_refusal_names_three_foreign_operators_and_leaves_onnx_runtime_s_and_atc_s_alone(tmp_path, fake_atc):
    """The first three kinds are named. The check is of the source: the CPU OM's own graph holds
    ONNX Runtime's fused com.microsoft operators (FusedConv here), which never reach a device;
    ATC judges a model itself (a custom op plugin on its host may parse the operator)."""
    ops = [("com.microsoft", "Gelu"), ("com.microsoft", "Gelu"), ("ai.onnx.ml", "Scaler"),
           ("com.microsoft", "FastGelu"), ("custom", "Mine"), ("custom", "Yours")]
    with pytest.raises(CompileError, match=r"outside the ONNX domain \(com\.microsoft:Gelu, ai\.onnx\.ml:Scaler, "
                                           r"com\.microsoft:FastGelu and 2 more\), for which"):
        compile_model(_foreign(tmp_path / "m.onnx", ops), target="cpu", log=lambda _: None)
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["b", 1, 5, 5])],
                              [vi("y", TensorProto.FLOAT, ["b", 2, 3, 3])],
                              [numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "conv.onnx")
    result = compile_model(src, target="cpu", log=lambda _: None)
    payload = onnx.load_from_string(container.read(result.path).payload)
    assert {(node.domain, node.op_type) for node in payload.graph.node} == {("com.microsoft", "FusedConv")}
    atc, record = fake_atc
    result = compile_model(_foreign(tmp_path / "gelu.onnx"), tmp_path / "gelu_npu.om", soc_version="Ascend310P3",
                           atc=str(atc), log=lambda _: None)
    assert result.target == "npu" and record.exists()


def test_a_precision_mode_in_another_case_is_taken_as_atc_writes_it(tmp_path, fake_atc):
    """A named choice in any case (README "Configuration"), as the config's reader takes it: ATC is
    given its lower case."""
    atc, record = fake_atc
    src = _relu(tmp_path / "relu.onnx")
    compile_model(src, precision_mode="Force_FP32", soc_version="Ascend310P3", atc=str(atc), log=lambda _: None)
    assert "--precision_mode=force_fp32" in record.read_text()
