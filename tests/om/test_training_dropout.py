"""A Dropout in training mode is refused on both targets (om/training_dropout.py): PyTorch's export
with training=TrainingMode.TRAINING (a tester, t96) compiled silently, its dropout random on an NPU
and removed by the CPU compile's optimiser. onnx.helper models, the CLI, the stand-in ATC, the CPU
runtime through the pyACL API."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from tests.tiny_models import dropout_onnx

from .acl_runner import acl_context, cpu_acl, run_batch
from .conftest import quiet, run_cli, saved_onnx

vi = helper.make_tensor_value_info
REFUSAL = ("aclserve compile: error: Dropout node '/dropout/Dropout' is in training mode: every answer would be "
           "dropped out at random; the usual cause is an export without model.eval() (torch.onnx.export(..., "
           "training=TrainingMode.TRAINING)); export it again after model.eval() (a model meant to drop out as it "
           "serves, Monte-Carlo dropout, writes its mask with RandomUniformLike, which compiles as a sampling model: "
           "its answers vary from run to run)")


@pytest.mark.parametrize("given_as", ["constant", "initializer", "cast", "branch"])
def test_a_dropout_in_training_mode_is_refused_on_both_targets(tmp_path, fake_atc, given_as):
    """Its training_mode a Constant node (PyTorch's), an initializer, a Constant cast to bool, or
    read by a Dropout in an If's branch: refused in one line naming the node and the fix, before
    ATC runs. In inference mode it compiles and answers as ONNX Runtime does on the source."""
    src = dropout_onnx(tmp_path / "train.onnx", True, given_as)
    out = tmp_path / "m.om"
    atc, record = fake_atc
    for target in (["--target", "cpu"], ["--atc", atc, "--soc-version", "Ascend310P3"]):
        proc = run_cli("compile", src, "-o", out, *target)
        assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [REFUSAL]), proc.stderr
        assert not out.exists() and not record.exists()
    src = dropout_onnx(tmp_path / "eval.onnx", False, given_as)
    result = compile_model(src, out, target="cpu", log=quiet)
    assert result.header["gears"] == [1, 2, 4, 8, 16, 32]
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    acl = cpu_acl()
    with acl_context(acl):
        for gear in (1, 4):
            np.testing.assert_array_equal(run_batch(acl, str(out), {"x": x[:gear]}, gear)["y"], want[:gear])


def test_every_dropout_in_training_mode_is_counted_and_a_sampling_model_compiles(tmp_path):
    """Two in training mode: the first named, the other counted (a transformer's export holds
    dozens). What is not refused: one of ratio 0 (it drops nothing), and operators random on
    purpose (a sampling model's answers vary from run to run, as the README says)."""
    inits = [numpy_helper.from_array(np.array(True), "on"), numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(0.0, np.float32), "none")]
    nodes = [helper.make_node("Dropout", ["x", "half", "on"], ["d1"], name="first"),
             helper.make_node("Dropout", ["d1", "", "on"], ["y"], name="second")]
    src = saved_onnx(tmp_path, "two", nodes, [vi("x", TensorProto.FLOAT, ["b", 4])],
                     [vi("y", TensorProto.FLOAT, ["b", 4])], inits)
    with pytest.raises(CompileError, match=r"^Dropout node 'first' \(and 1 more\) is in training mode: "):
        compile_model(src, tmp_path / "two.om", target="cpu", log=quiet)
    src = saved_onnx(tmp_path, "ratio0", [helper.make_node("Dropout", ["x", "none", "on"], ["y"])],
                     [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("y", TensorProto.FLOAT, ["b", 4])], inits)
    assert compile_model(src, tmp_path / "ratio0.om", target="cpu", log=quiet).header["gears"]
    for op in ("RandomNormalLike", "RandomUniformLike", "Bernoulli"):
        src = saved_onnx(tmp_path, op, [helper.make_node(op, ["x"], ["y"])], [vi("x", TensorProto.FLOAT, ["b", 4])],
                         [vi("y", TensorProto.FLOAT, ["b", 4])])
        assert compile_model(src, tmp_path / f"{op}.om", target="cpu", log=quiet).header["gears"]
