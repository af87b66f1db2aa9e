"""What a compile says of the batch dimension and of types it cannot serve, where the model
leaves it to be guessed (a tester, t85): a sequence-first model ([T, N, F], an RNN's) was refused
as "dim 1 is dynamic (batch)"; inputs naming dimension 0 differently ([N, 4] and [M, 4]) were taken
for one batch without a word; an input or output of a sequence or optional type was "not a tensor",
its type unnamed (om/batch_dims.py, om/onnx_types.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import CompileError, compile_model
from .conftest import quiet, run_cli, saved_onnx

vi = helper.make_tensor_value_info


def lstm(tmp_path, name: str, dims: list) -> str:
    """An LSTM over x `dims` ([T, N, 4], time first, as PyTorch's default), its y [T, N, 8]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 32, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 32, 8)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([1], np.int64), "directions")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["Y"], hidden_size=8),
             helper.make_node("Squeeze", ["Y", "directions"], ["y"])]
    return saved_onnx(tmp_path, name, nodes, [vi("x", TensorProto.FLOAT, dims)],
                      [vi("y", TensorProto.FLOAT, dims[:2] + [8])], inits)


@pytest.mark.parametrize("dims, shown, example", [(["seq", "batch", 4], "(batch; shape [?,?,4])", "x:16,1,4"),
                                                  ([5, "N", 4], "(N; shape [5,?,4])", "x:5,1,4")],
                         ids=["open-time", "fixed-time"])
def test_a_sequence_first_model_is_told_its_batch_must_come_first(tmp_path, dims, shown, example):
    src = lstm(tmp_path, "rnn", dims)
    out = tmp_path / "rnn.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"input 'x' has its batch at dimension 1 {shown}, as a sequence-first model" in line, line
    assert ("aclserve batches requests along dimension 0 only, as ATC's --dynamic_batch_size does; export the model "
            "batch-first (its batch at dimension 0), or compile it without batch sizes, every dimension fixed: "
            f"--input-shape \"{example}\"") in line, line
    # said so with batch sizes asked for too ("--batch given but the model has no batch dimension")
    with pytest.raises(CompileError, match="has its batch at dimension 1"):
        compile_model(src, out, batch="1,2", target="cpu", log=quiet)
    # what it says compiles: a static model
    assert compile_model(src, out, input_shape=example, target="cpu", log=quiet).header["gears"] == []
    # a batch first, an "n" after it is no batch (a count of points, say): that dimension is to be fixed
    points = saved_onnx(tmp_path, "points", [helper.make_node("Neg", ["x"], ["y"])],
                        [vi("x", TensorProto.FLOAT, ["batch", "n", 3])],
                        [vi("y", TensorProto.FLOAT, ["batch", "n", 3])])
    with pytest.raises(CompileError, match=r"^input 'x' dim 1 is dynamic \(n\); fix it with --input-shape"):
        compile_model(points, out, target="cpu", log=quiet)
    # nor is an "N" after an open dimension 0 ([?, N, 3]: N boxes or points; a review)
    boxes = saved_onnx(tmp_path, "boxes", [helper.make_node("Neg", ["x"], ["y"])],
                       [vi("x", TensorProto.FLOAT, [None, "N", 3])], [vi("y", TensorProto.FLOAT, [None, "N", 3])])
    with pytest.raises(CompileError, match=r"^input 'x' dim 1 is dynamic \(N\); fix it with --input-shape"):
        compile_model(boxes, out, target="cpu", log=quiet)


def _two_inputs(tmp_path, first: str, second: str) -> str:
    nodes = [helper.make_node("Neg", ["a"], ["ya"]), helper.make_node("Abs", ["b"], ["yb"])]
    return saved_onnx(tmp_path, f"two-{first}-{second}", nodes,
                      [vi("a", TensorProto.FLOAT, [first, 4]), vi("b", TensorProto.FLOAT, [second, 4])],
                      [vi("ya", TensorProto.FLOAT, [first, 4]), vi("yb", TensorProto.FLOAT, [second, 4])])


def test_inputs_naming_dimension_0_differently_are_said_to_share_the_batch(tmp_path):
    proc = run_cli("compile", _two_inputs(tmp_path, "N", "M"), "-o", tmp_path / "two.om", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert ("warning: inputs 'a' (N) and 'b' (M) name their dimension 0 with different symbols: both are taken "
            "for the one batch dimension, as ATC takes every -1 first dimension under --dynamic_batch_size, so a "
            "request must give them the same number of rows") in proc.stdout, proc.stdout
    # said as one batch (-1s given), or sharing its symbol: nothing to say
    said = compile_model(_two_inputs(tmp_path, "N", "M"), tmp_path / "given.om", input_shape="a:-1,4;b:-1,4",
                         target="cpu", log=quiet)
    shared = compile_model(_two_inputs(tmp_path, "N", "N"), tmp_path / "one.om", target="cpu", log=quiet)
    assert said.header["gears"] and not said.warnings and shared.header["gears"] and not shared.warnings


def test_an_input_or_output_that_is_not_a_tensor_is_named_by_its_type(tmp_path):
    sequence = helper.make_tensor_sequence_value_info
    seq_in = saved_onnx(tmp_path, "seq_in", [helper.make_node("SequenceAt", ["s", "i"], ["y"])],
                        [sequence("s", TensorProto.FLOAT, None), vi("i", TensorProto.INT64, [])],
                        [vi("y", TensorProto.FLOAT, None)])
    with pytest.raises(CompileError, match=r"^input 's' has type seq\(tensor\(float\)\), not a tensor: .* give the "
                                           r"model a tensor input in its place \(e\.g\. with SplitToSequence"):
        compile_model(seq_in, target="cpu", log=quiet)
    optional = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.INT64, [3])))
    opt_out = saved_onnx(tmp_path, "opt_out", [helper.make_node("Optional", ["x"], ["o"])],
                         [vi("x", TensorProto.INT64, [3])], [optional])
    with pytest.raises(CompileError, match=r"^output 'o' has type optional\(tensor\(int64\)\), not a tensor: .* "
                                           r"\(e\.g\. with OptionalGetElement in the model\)$"):
        compile_model(opt_out, target="cpu", log=quiet)


def _lstm_with_state(tmp_path, x_dims: list, name: str = "state", batch: str = "batch", layout: int = 0) -> str:
    """An LSTM exported batch_first with its initial state (a tester's, t96): x `dims`, time moved
    first inside, h0 and c0 [1, batch, 8] (PyTorch's layout for states whatever batch_first says;
    c0 through an Identity, as exporters leave some), its last step's h [batch, 8]; `batch` the
    symbol of the batch, `layout` the LSTM node's."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 32, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 32, 8)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([0], np.int64), "directions")]
    batch_first = x_dims[0] == batch
    nodes = [helper.make_node("Transpose", ["x"], ["time_first"], perm=[1, 0, 2]),
             helper.make_node("Identity", ["c0"], ["c0_kept"]),
             helper.make_node("LSTM", ["time_first" if batch_first else "x", "W", "R", "", "", "h0", "c0_kept"],
                              ["", "hn"], hidden_size=8, name="rnn", **({"layout": layout} if layout else {})),
             helper.make_node("Squeeze", ["hn", "directions"], ["y"])]
    if not batch_first:
        del nodes[0]
    states = [vi(n, TensorProto.FLOAT, [1, batch, 8]) for n in ("h0", "c0")]
    return saved_onnx(tmp_path, name, nodes, [vi("x", TensorProto.FLOAT, x_dims)] + states,
                      [vi("y", TensorProto.FLOAT, [batch, 8])], inits)


def test_an_rnns_initial_state_is_told_its_own_way_out(tmp_path):
    """h0 and c0 [layers, N, H] were refused as a sequence-first model's input, told to export the
    model batch-first: it was, and states keep that layout in any export (a tester, t96)."""
    src = _lstm_with_state(tmp_path, ["batch", 12, 4])
    out = tmp_path / "state.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu")
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert ("input 'h0' has its batch at dimension 1 (batch; shape [1,?,8]): 'h0' (initial_h) and 'c0' (initial_c) "
            "are the initial state of LSTM node 'rnn', whose batch is at dimension 1 in ONNX's layout ([layers, N, "
            "H]) whatever batch_first says, so an export batch-first changes nothing") in line, line
    assert ("wrap the model so that it takes the state batch-first ([N, layers, H]) and transposes it inside "
            "(h0.transpose(0, 1) before the RNN), and gives back any final state so too; or leave the state out of "
            "its inputs where it starts at zero (the RNN's default); or compile it without batch sizes, every "
            'dimension fixed: --input-shape "x:1,12,4;h0:1,1,8;c0:1,1,8" (a request then gives that shape)') in line
    assert "export the model batch-first" not in line and "sequence-first" not in line, line
    # what it says compiles
    assert compile_model(src, out, input_shape="x:1,12,4;h0:1,1,8;c0:1,1,8", target="cpu",
                         log=quiet).header["gears"] == []
    # a sequence-first x besides: it is told to export batch-first, the states their own way
    with pytest.raises(CompileError) as both:
        compile_model(_lstm_with_state(tmp_path, [12, "batch", 4], "both"), out, target="cpu", log=quiet)
    assert str(both.value).startswith("input 'x' has its batch at dimension 1 (batch; shape [12,?,4]), as a "
                                      "sequence-first model"), both.value
    assert ("export the model batch-first (its batch at dimension 0; 'h0' (initial_h) and 'c0' (initial_c) are the "
            "initial state of LSTM node 'rnn', whose batch is at dimension 1 in ONNX's layout") in str(both.value)


def test_an_rnns_initial_state_is_told_apart_by_the_graph_whatever_its_batch_is_named(tmp_path):
    """A torch.export (dynamo) export names its dimensions s0, s1, ...: x [s0, s1, 4] beside h0 and
    c0 [1, s0, 8] was told to fix s1 and the states' s0 as open dimensions (the states' fixed, the
    model then took no batch). The graph shows them an LSTM's initial state: theirs is the message,
    and its example fixes s0 as the batch, at 1, everywhere; x [s1, s0, 4] beside them is
    sequence-first, and a state left unnamed ([1, ?, 8]) is told apart too."""
    out = tmp_path / "dynamo.om"
    src = _lstm_with_state(tmp_path, ["s0", "s1", 4], "dynamo", batch="s0")
    value = "x:1,16,4;h0:1,1,8;c0:1,1,8"
    for gears in (None, [1, 2, 4]):
        with pytest.raises(CompileError) as state:
            compile_model(src, out, batch=gears, target="cpu", log=quiet)
        assert str(state.value).startswith(
            "input 'h0' has its batch at dimension 1 (s0; shape [1,?,8]): 'h0' (initial_h) and 'c0' (initial_c) are "
            "the initial state of LSTM node 'rnn', whose batch is at dimension 1 in ONNX's layout ([layers, N, H]) "
            "whatever batch_first says, so an export batch-first changes nothing"), state.value
        assert str(state.value).endswith(f'--input-shape "{value}" (a request then gives that shape)'), state.value
    assert compile_model(src, out, input_shape=value, target="cpu", log=quiet).header["gears"] == []
    with pytest.raises(CompileError) as both:
        compile_model(_lstm_with_state(tmp_path, ["s1", "s0", 4], "dynamo_t", batch="s0"), out, target="cpu",
                      log=quiet)
    assert str(both.value).startswith("input 'x' has its batch at dimension 1 (s0; shape [?,?,4]), as a "
                                      "sequence-first model"), both.value
    assert str(both.value).endswith('--input-shape "x:16,1,4;h0:1,1,8;c0:1,1,8" (a request then gives that shape)')
    with pytest.raises(CompileError, match=r"^input 'h0' has its batch at dimension 1 \(\?; shape \[1,\?,8\]\): 'h0' "):
        compile_model(_lstm_with_state(tmp_path, ["s0", 12, 4], "unnamed", batch=None), out, target="cpu", log=quiet)


def test_an_rnn_taking_its_state_batch_first_is_not_told_it_is_not(tmp_path):
    """An RNN node of layout 1 takes its state batch-first, [N, layers, H]: not one whose batch is at
    dimension 1 (ONNX Runtime's CPU LSTM does not take that layout: the graph alone is read)."""
    from aclserve.om.batch_dims import rnn_states
    from aclserve.om.spec import load_onnx
    for layout, found in ((0, {"h0": ("initial_h", "LSTM node 'rnn'"), "c0": ("initial_c", "LSTM node 'rnn'")}),
                          (1, {})):
        assert rnn_states(load_onnx(_lstm_with_state(tmp_path, ["s0", 12, 4], f"l{layout}", "s0", layout)).graph) \
            == found


def test_every_open_dimension_is_said_at_once_with_an_input_shape_that_fixes_them(tmp_path):
    """A transformer's input_ids and attention_mask [batch, seq]: the refusal named input_ids only,
    and the compile with it fixed was refused for attention_mask (a tester, t96). Each symbol gets
    one placeholder, an unnamed dimension one of its own; an input --input-shape gave is in the
    value, which replaces it."""
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ids", "mask"], ["kept"]),
             helper.make_node("ReduceSum", ["kept", "one"], ["y"], keepdims=1),
             helper.make_node("ReduceSum", ["extra", "one"], ["z"], keepdims=0),
             helper.make_node("Neg", ["scale"], ["w"])]
    src = saved_onnx(tmp_path, "tokens", nodes,
                     [vi("input_ids", TensorProto.INT64, ["batch", "seq"]),
                      vi("attention_mask", TensorProto.INT64, ["batch", "seq"]),
                      vi("extra", TensorProto.FLOAT, ["batch", None, 3]), vi("scale", TensorProto.FLOAT, ["batch", 2])],
                     [vi("y", TensorProto.FLOAT, ["batch", 1]), vi("z", TensorProto.FLOAT, ["batch", 3]),
                      vi("w", TensorProto.FLOAT, ["batch", 2])],
                     [numpy_helper.from_array(np.array([1], np.int64), "one")])
    out = tmp_path / "tokens.om"
    proc = run_cli("compile", src, "-o", out, "--target", "cpu", "--input-shape", "scale:-1,2")
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    value = "input_ids:-1,SEQ;attention_mask:-1,SEQ;extra:-1,SIZE,3;scale:-1,2"
    assert line == ("aclserve compile: error: input 'input_ids' dim 1 is dynamic (seq), as are input "
                    "'attention_mask' dim 1 (seq) and input 'extra' dim 1 (?); fix them with --input-shape (only the "
                    f"batch dimension may be dynamic), e.g. --input-shape \"{value}\" (SEQ, SIZE: the sizes to serve, "
                    "which every request then gives)"), line
    # what it says compiles, its placeholders given sizes
    fixed = compile_model(src, out, input_shape=value.replace("SEQ", "16").replace("SIZE", "5"), target="cpu",
                          log=quiet).header
    assert [t["dims"] for t in fixed["inputs"][:4]] == [[-1, 16], [-1, 16], [-1, 5, 3], [-1, 2]], fixed
    # one dimension: "it"; the inputs --input-shape gave are in the value
    with pytest.raises(CompileError, match=r"^input 'extra' dim 1 is dynamic \(\?\); fix it with --input-shape \(only "
                                           r"the batch dimension may be dynamic\), e\.g\. --input-shape "
                                           r"\"input_ids:-1,16;attention_mask:-1,16;extra:-1,SIZE,3\" \(SIZE: the size "
                                           r"to serve, which every request then gives\)$"):
        compile_model(src, out, input_shape="input_ids:-1,16;attention_mask:-1,16", target="cpu", log=quiet)
