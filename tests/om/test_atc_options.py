"""What ATC would refuse among a compile's options (om/atc_options.py): an independent tester
compiled `--precision-mode bogus`, `--soc-version Bogus123` and opsets 7 and 28 to CPU OMs without
a word. A precision mode outside ATC's list is refused on both targets; a SoC or an opset ATC may
refuse is a warning in the CPU compile's summary."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from aclserve.om.compile import compile_model
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
