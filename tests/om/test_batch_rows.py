"""A model whose rows depend on each other is not compiled as a batch model (om/batch_rows.py):
the batcher puts concurrent requests into one run, and an independent tester's Softmax over dim 0
answered 0.835 and 0.165 to two one-row requests batched together, 1.0 alone; a sequence-first
export ([seq, 1, 4], CumSum over its time axis) compiled with its time axis as the batch."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from .conftest import quiet, run_cli, save, saved_onnx

vi = helper.make_tensor_value_info


def _softmax_over_rows(tmp_path):
    return saved_onnx(tmp_path, "crossbatch", [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
                      [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("y", TensorProto.FLOAT, ["b", 4])])


def _sequence_first(tmp_path):
    """[seq, 1, 4], a running sum over the sequence: a PyTorch RNN's export without batch_first."""
    return saved_onnx(tmp_path, "seqfirst", [helper.make_node("CumSum", ["x", "axis"], ["y"])],
                      [vi("x", TensorProto.FLOAT, ["seq", 1, 4])], [vi("y", TensorProto.FLOAT, ["seq", 1, 4])],
                      [numpy_helper.from_array(np.array(0, np.int64), "axis")])


def _share_of_the_batch(tmp_path, share: float):
    """y = x + share * (the sum of the batch's rows): a row sees the others by `share`."""
    nodes = [helper.make_node("ReduceSum", ["x", "zero"], ["total"], keepdims=1),
             helper.make_node("Mul", ["total", "share"], ["part"]), helper.make_node("Add", ["x", "part"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array(share, np.float32), "share")]
    return saved_onnx(tmp_path, f"share{share:g}", nodes, [vi("x", TensorProto.FLOAT, ["b", 64])],
                      [vi("y", TensorProto.FLOAT, ["b", 64])], inits)


@pytest.mark.parametrize("make, example", [(_softmax_over_rows, "x:SIZE,4"), (_sequence_first, "x:SIZE,1,4")],
                         ids=["softmax-over-rows", "sequence-first"])
def test_a_model_whose_rows_depend_on_each_other_is_refused_as_a_batch_model(tmp_path, make, example):
    src = make(tmp_path)
    out = tmp_path / "m.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 2 and not out.exists()
    (line,) = proc.stderr.strip().splitlines()
    assert ("the rows of input 'x' along the dynamic dimension 0 are not independent: output 'y' of a row run "
            "with another row differs from that row run alone by up to ") in line, line
    assert ("so a batch would mix concurrent requests' answers; compile it for a static batch (--batch 1) or fix "
            f"that dimension with --input-shape \"{example}\", as ATC takes it") in line, line
    # what it says serves: a static model, one request a run
    assert compile_model(src, out, batch="1", target="cpu", log=quiet).header["gears"] == []
    fixed = example.replace("SIZE", "16")
    assert compile_model(src, out, input_shape=fixed, target="cpu", log=quiet).header["gears"] == []


def test_under_aipp_the_advice_names_the_models_own_input_shape(tmp_path):
    """--input-shape names the ONNX model's inputs (NCHW float), which AIPP's pictures (uint8
    NHWC) are put in front of: the refusal advised "x:SIZE,4,4,3", the picture's shape, which
    --input-shape then refused (an independent tester)."""
    src = saved_onnx(tmp_path, "crossimage", [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
                     [vi("x", TensorProto.FLOAT, ["b", 3, 4, 4])], [vi("y", TensorProto.FLOAT, ["b", 3, 4, 4])])
    out = tmp_path / "m.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu", "--image-input", "bgr", "--mean", "1,2,3")
    assert proc.returncode == 2 and not out.exists()
    assert 'or fix that dimension with --input-shape "x:SIZE,3,4,4", as ATC takes it' in proc.stderr, proc.stderr
    proc = run_cli("compile", src, "-o", out, "--target", "cpu", "--image-input", "bgr", "--mean", "1,2,3",
                   "--input-shape", "x:2,3,4,4")  # what it says compiles
    assert proc.returncode == 0, proc.stderr
    assert json.loads(run_cli("inspect", out, "--json").stdout)["header"]["inputs"][0]["dims"] == [2, 4, 4, 3]


def test_a_row_may_differ_by_rounding_not_by_another_rows_share(tmp_path):
    """Another batch size may take other kernels, which round differently: a share of 1e-7 of the
    other rows passes as such (within 1e-5 + 1e-4 x the output's magnitude), 1e-2 is a mix."""
    assert compile_model(_share_of_the_batch(tmp_path, 1e-7), target="cpu", log=quiet).header["gears"]
    with pytest.raises(CompileError) as refused:
        compile_model(_share_of_the_batch(tmp_path, 1e-2), target="cpu", log=quiet)
    # how much, and against what: "(by 0.12; its values reach 3.1)" left a tester guessing (t85)
    assert re.search(r"output 'y' of a row run with another row differs from that row run alone by up to 0\.\d+, "
                     r"more than rounding accounts for \([\d.e-]+: 1e-05 \+ 0\.0001 x [\d.]+, the largest absolute "
                     r"value of that output\)", str(refused.value)), refused.value


def test_an_output_of_a_random_op_is_not_judged_the_others_are(tmp_path):
    """A random op answers otherwise at every run, alone or not: not a mix of rows. Its other
    outputs are still compared."""
    x, noise, mixed = (vi(n, TensorProto.FLOAT, ["b", 4]) for n in ("x", "noisy", "mixed"))
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["r"]), helper.make_node("Add", ["x", "r"], ["noisy"]),
             helper.make_node("Softmax", ["x"], ["mixed"], axis=0)]
    noisy = saved_onnx(tmp_path, "noise", nodes[:2], [x], [noise])
    assert compile_model(noisy, target="cpu", log=quiet).header["gears"]
    with pytest.raises(CompileError, match="output 'mixed' of a row run with another row differs"):
        compile_model(saved_onnx(tmp_path, "both", nodes, [x], [noise, mixed]), target="cpu", log=quiet)


def test_the_atc_path_refuses_it_before_atc_runs(tmp_path, fake_atc):
    """A device batches requests alike: ONNX Runtime runs the source with the compile's shapes
    before ATC's minutes; a model it cannot run (an operator only ATC has) goes to ATC unjudged."""
    atc, record = fake_atc
    with pytest.raises(CompileError, match="the rows of input 'x' along the dynamic dimension 0 are not independent"):
        compile_model(_softmax_over_rows(tmp_path), tmp_path / "c.om", soc_version="Ascend310P3", atc=str(atc),
                      log=quiet)
    assert not record.exists()
    graph = helper.make_graph([helper.make_node("AscendOnly", ["x"], ["y"], domain="com.example")], "custom",
                              [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("y", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    result = compile_model(save(model, tmp_path / "custom.onnx"), tmp_path / "custom.om", soc_version="Ascend310P3",
                           atc=str(atc), log=quiet)
    assert result.target == "npu" and "--dynamic_batch_size=1,2,4,8,16,32" in json.loads(record.read_text())["argv"]


def test_a_model_quantized_dynamically_is_a_batch_model(tmp_path):
    """onnxruntime's quantize_dynamic takes one activation scale for the whole batch, so a row's
    answer moves a little with its companions (0.6 % in a review's MLP), by design and on any
    server that batches it: the check refused such models, a common kind on CPUs."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
               for name, shape in (("w1", (256, 512)), ("w2", (512, 10)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w2"], ["y"])]
    mlp = saved_onnx(tmp_path, "mlp", nodes, [vi("x", TensorProto.FLOAT, ["N", 256])],
                     [vi("y", TensorProto.FLOAT, ["N", 10])], weights)
    quantize_dynamic(mlp, tmp_path / "mlp_q.onnx", weight_type=QuantType.QInt8)
    assert compile_model(tmp_path / "mlp_q.onnx", tmp_path / "q.om", target="cpu", log=quiet).header["gears"]


def test_the_atc_path_leaves_an_output_without_the_batch_first_to_the_server(tmp_path, fake_atc):
    """A second output [2, N, 4] (a bidirectional LSTM's h_n): its rows cannot be compared, and
    the ATC path's check called it rows that depend on each other (the CPU path says it is not
    batch-major; the server refuses such an OM at load in those words)."""
    atc, record = fake_atc
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["x3"]),
             helper.make_node("Transpose", ["x3"], ["hn"], perm=[1, 0, 2]), helper.make_node("Relu", ["x"], ["y"])]
    src = saved_onnx(tmp_path, "hn", nodes, [vi("x", TensorProto.FLOAT, ["N", 8])],
                     [vi("y", TensorProto.FLOAT, ["N", 8]), vi("hn", TensorProto.FLOAT, [2, "N", 4])],
                     [numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape")])
    result = compile_model(src, tmp_path / "hn.om", soc_version="Ascend310P3", atc=str(atc), log=quiet)
    assert result.target == "npu" and record.exists()


def _branch_on_the_batch(tmp_path, statistic: str, compare: str):
    """If(statistic(x) compare 0, Neg(x), Relu(x)), the statistic over the whole batch (an
    independent tester's, with ReduceSum and Greater: 2 of 320 answers wrong under load)."""
    then_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["negated"])], "then", [],
                                    [vi("negated", TensorProto.FLOAT, ["b", 4])])
    else_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["kept"])], "else", [],
                                    [vi("kept", TensorProto.FLOAT, ["b", 4])])
    nodes = [helper.make_node(statistic, ["x"], ["s"], keepdims=0), helper.make_node(compare, ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    return saved_onnx(tmp_path, f"if_{statistic}", nodes, [vi("x", TensorProto.FLOAT, ["b", 4])],
                      [vi("y", TensorProto.FLOAT, ["b", 4])], [zero])


@pytest.mark.parametrize("statistic, compare", [("ReduceSum", "Greater"), ("ReduceMax", "Greater"),
                                                ("ReduceMin", "Less")])
def test_a_branch_on_a_statistic_of_the_whole_batch_is_refused_on_both_targets(tmp_path, fake_atc, statistic,
                                                                                compare):
    """Seeded normal rows, or zeros and ones, gave each row the sign of the batch: such a model
    compiled and a row batched with another got the other's branch. A positive row and a negative
    one find it; a branch on a row's own sum (Where) is no mix and compiles."""
    src = _branch_on_the_batch(tmp_path, statistic, compare)
    with pytest.raises(CompileError, match=r"the rows of input 'x' along the dynamic dimension 0 are not "
                                           r"independent: output 'y' of a row run with another row differs"):
        compile_model(src, tmp_path / "m.om", target="cpu", log=quiet)
    atc, record = fake_atc
    with pytest.raises(CompileError, match="the rows of input 'x' along the dynamic dimension 0 are not independent"):
        compile_model(src, tmp_path / "c.om", soc_version="Ascend310P3", atc=str(atc), log=quiet)
    assert not record.exists() and not (tmp_path / "m.om").exists()
    nodes = [helper.make_node("ReduceSum", ["x", "one"], ["s"], keepdims=1),
             helper.make_node(compare, ["s", "zero"], ["c"]),
             helper.make_node("Neg", ["x"], ["negated"]), helper.make_node("Relu", ["x"], ["kept"]),
             helper.make_node("Where", ["c", "negated", "kept"], ["y"])]
    own = saved_onnx(tmp_path, "own_sign", nodes, [vi("x", TensorProto.FLOAT, ["b", 4])],
                     [vi("y", TensorProto.FLOAT, ["b", 4])], [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                                                              numpy_helper.from_array(np.array([1], np.int64), "one")])
    assert compile_model(own, tmp_path / "own.om", target="cpu", log=quiet).header["gears"]


def _batch_norm(tmp_path, opset: int, outputs: list[str], **attributes) -> str:
    """y = BatchNormalization(x) over x [b, 2, 3, 3] (a row alone has a variance of its own), with
    the outputs and attributes given. Its four vectors differ: ONNX Runtime shares initializers of
    one value, and its BatchNormalization in training mode then answered otherwise at each run."""
    inits = [numpy_helper.from_array(np.array(values, np.float32), name)
             for name, values in (("scale", [1.5, 0.5]), ("bias", [0.1, -0.1]), ("mean", [0.2, -0.2]),
                                  ("var", [0.9, 1.1]))]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], outputs, name="bn",
                              **attributes)]
    graph = helper.make_graph(nodes, "bn", [vi("x", TensorProto.FLOAT, ["b", 2, 3, 3])],
                              [vi("y", TensorProto.FLOAT, ["b", 2, 3, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return save(model, tmp_path / f"bn{opset}.onnx")


@pytest.mark.parametrize("opset, outputs, attributes",
                         [(17, ["y", "running_mean", "running_var"], {"training_mode": 1}),
                          (12, ["y", "new_mean", "new_var", "saved_mean", "saved_var"], {})],
                         ids=["training_mode", "opset-12-statistics-out"])
def test_a_batch_norm_in_training_mode_is_said_to_be_the_likely_cause(tmp_path, fake_atc, opset, outputs,
                                                                      attributes):
    """A PyTorch export without model.eval() (a tester, t96: TrainingMode.TRAINING writes
    training_mode 1 and the running statistics as outputs; opsets before 14 the statistics only)
    was told only to fix the batch, which would still normalise each request by its own rows."""
    src = _batch_norm(tmp_path, opset, outputs, **attributes)
    out = tmp_path / "bn.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 2 and not out.exists()
    (line,) = proc.stderr.strip().splitlines()
    assert "the rows of input 'x' along the dynamic dimension 0 are not independent" in line, line
    assert line.endswith("as ATC takes it; BatchNormalization node 'bn' is in training mode, normalising a batch by "
                         "its own mean and variance: the usual cause is an export without model.eval() (PyTorch's "
                         "torch.onnx.export of a model in training mode, or with training=TrainingMode.TRAINING): "
                         "export it again after model.eval()"), line
    atc, record = fake_atc  # (said so on the ATC path too, whose check runs the source)
    with pytest.raises(CompileError, match=r"BatchNormalization node 'bn' is in training mode"):
        compile_model(src, tmp_path / "c.om", soc_version="Ascend310P3", atc=str(atc), log=quiet)
    # in inference mode it normalises each row by the running statistics: a batch model, nothing to say
    assert compile_model(_batch_norm(tmp_path, 17, ["y"]), out, target="cpu", log=quiet).header["gears"]
    with pytest.raises(CompileError) as softmax:
        compile_model(_softmax_over_rows(tmp_path), out, target="cpu", log=quiet)
    assert "model.eval()" not in str(softmax.value)


def test_a_sampling_models_draws_are_not_judged(tmp_path, fake_atc):
    """Twenty Bernoulli draws of one value each a row: two runs of a row agreed by chance, so the
    run-twice test judged the output, and the next runs' draws then differed between a row together
    and alone: the compile refused it as not independent at random (two tries of six). An output
    no random op reaches is still judged: a Softmax over the batch beside them is refused."""
    draws = [f"draw{i}" for i in range(20)]
    nodes = [helper.make_node("Sigmoid", ["x"], ["p"]), helper.make_node("Bernoulli", ["p"], ["b"]),
             helper.make_node("Split", ["b", "ones"], draws, axis=1)]
    ones = numpy_helper.from_array(np.ones(20, np.int64), "ones")
    outputs = [vi(name, TensorProto.FLOAT, ["n", 1]) for name in draws]
    src = saved_onnx(tmp_path, "draws", nodes, [vi("x", TensorProto.FLOAT, ["n", 20])], outputs, [ones])
    assert compile_model(src, tmp_path / "draws.om", target="cpu", log=quiet).header["gears"]
    atc, _ = fake_atc  # (the ATC path's check, on the source)
    assert compile_model(src, tmp_path / "a.om", soc_version="Ascend310P3", atc=str(atc), log=quiet).target == "npu"
    nodes.append(helper.make_node("Softmax", ["x"], ["mixed"], axis=0))
    src = saved_onnx(tmp_path, "mixed", nodes, [vi("x", TensorProto.FLOAT, ["n", 20])],
                     outputs + [vi("mixed", TensorProto.FLOAT, ["n", 20])], [ones])
    with pytest.raises(CompileError, match="output 'mixed' of a row run with another row differs"):
        compile_model(src, tmp_path / "mixed.om", target="cpu", log=quiet)
