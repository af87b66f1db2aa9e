"""Whether a dynamic-batch model's rows are independent: the batcher puts concurrent requests
into one run, so a model whose output for one row depends on the other rows answers each client
with something computed from another client's data. Softmax or CumSum over dim 0, a batch norm
left in training mode, and a sequence-first export ([seq, batch, features], a PyTorch RNN without
batch_first: its dim 0 is time) compiled as batch models and mixed requests (found by an
independent tester: a Softmax over dim 0 answered 0.835 and 0.165 for two requests batched
together, 1.0 for each alone).

The check runs a batch of two different rows and each row alone, and compares row by row; then
two rows a statistic of the whole batch tells apart, a positive row and a negative one ten times
its size: a branch on the batch's sum, mean, extremes or size (If(ReduceSum(x) > 0, Neg(x),
Relu(x)): an independent tester's, 2 of 320 answers wrong under load) answers a row with what
another row chose, where seeded normal rows, or zeros and ones, may give each row the batch's sign. Other
batch sizes may take other kernels (ONNX Runtime's MatMul takes a GEMV for one row), which sum in
another order: a few units in the last place, so a row may differ by a tolerance relative to its
output's magnitude (fp32/fp64: 1e-5 + 1e-4 x its largest value; fp16, whose epsilon is 1e-3:
1e-3 + 1e-2 x); mixed rows differ at the scale of the values. Integer and boolean outputs must be
equal. A model that cannot run on the rows tried is not judged, nor an output a random operator
reaches (a sampling model's draws: RandomNormal, Bernoulli, Multinomial, ...) or that changes
from one run to the next (another random op: a custom one), nor a model quantized dynamically
(onnxruntime's quantize_dynamic: DynamicQuantizeLinear and its fused kernels take one scale for
the whole batch, so a row's answer moves a little with its companions, 0.6 % in a review's MLP,
by design and on any server that batches it). Only the outputs with the batch first are compared
(an LSTM's h_n, [layers, N, H], is another check's). Seven runs of one and two rows: cheap beside
the compile.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import onnx

from .external_files import external_bytes, external_locations
from .declared_shapes import drop_declared_shapes
from .spec import MAX_INLINE_BYTES, CompileError, ModelSpec
from .subgraphs import subgraphs

Run = Callable[[dict], list]  # feeds -> the outputs, in order
# (atol, rtol): a row may differ by atol + rtol x its output's largest value
FP16_TOLERANCE = (1e-3, 1e-2)
FLOAT_TOLERANCE = (1e-5, 1e-4)  # fp32, fp64
# operators that quantize with a scale computed from the whole batch (ONNX's, onnxruntime's fused ones)
BATCH_SCALED = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention"}
# ONNX's random operators (Dropout's randomness is training_dropout.py's)
RANDOM = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}


def refuse_mixed_rows(run: Run, spec: ModelSpec, output_names: list[str]) -> None:
    """Raise CompileError when an output of one row changes with the other rows of its batch."""
    if any(node.op_type in BATCH_SCALED for node in spec.model.graph.node):
        return
    sampled = _sampled(spec.model.graph)
    for fill in (_distinct_seeded_rows, _zero_and_one_rows):
        judged = _compare_rows(run, spec, output_names, fill, None, sampled)
        if judged is not None:
            break
    else:
        return
    # then rows a statistic of the whole batch tells apart (its sign, its size): a branch on it
    # answers a row with what another row chose (If(ReduceSum(x) > 0, Neg, Relu), an independent tester's)
    _compare_rows(run, spec, output_names, _opposite_rows, judged)


def _compare_rows(run: Run, spec: ModelSpec, output_names: list[str], fill, judged: list[int] | None,
                  sampled: frozenset = frozenset()):
    """Run two rows of `fill` together and each alone, raise CompileError for an output of a row
    that differs; return the outputs judged, None for a fill the model cannot run on (e.g. an index
    out of its table). `judged` None: found here, leaving out the `sampled` outputs and those a
    second run of the first row changes."""
    try:
        together = {t.name: fill(t) for t in spec.inputs}
        both = run(together)
        alone = [run({name: rows[i:i + 1] for name, rows in together.items()}) for i in (0, 1)]
        again = run({name: rows[:1] for name, rows in together.items()}) if judged is None else None
    except Exception:
        return None
    if judged is None:
        # the outputs with the batch first (2 rows together, 1 alone; on the CPU path the others
        # were refused) that give the same answer twice (a random op's change from run to run)
        judged = [i for i in range(len(output_names)) if output_names[i] not in sampled
                  and np.ndim(both[i]) and len(both[i]) == 2
                  and np.ndim(alone[0][i]) and len(alone[0][i]) == 1 and _difference(alone[0][i], again[i]) is None]
    for row in (0, 1):
        for i in judged:
            found = _difference(both[i][row:row + 1], alone[row][i])
            if found is not None:
                raise CompileError(_message(spec, output_names[i], *found))
    return judged


def _sampled(graph: onnx.GraphProto) -> frozenset:
    """The names a random operator of `graph` reaches (through any node reading one, or holding
    one or reading one in a subgraph): a sampling model's draws. Their two runs may agree by chance
    (a token of a peaked distribution, a Bernoulli's 0 or 1), so they are not judged at all: such
    an output passed the run-twice test, then differed between a row together and alone (a
    Bernoulli model's compile refused in two tries of six)."""
    reached: set[str] = set()
    for node in graph.node:  # (in order: ONNX's nodes are sorted, each after what it reads)
        if _draws(node, reached):
            reached.update(node.output)
    return frozenset(reached)


def _draws(node: onnx.NodeProto, reached: set[str]) -> bool:
    if (node.op_type in RANDOM and node.domain in ("", "ai.onnx")) or any(name in reached for name in node.input):
        return True
    return any(_draws(inner, reached) for graph in subgraphs(node) for inner in graph.node)


def check_source(model_path: str, spec: ModelSpec) -> None:
    """refuse_mixed_rows for a model ATC builds (a device batches requests alike), run by ONNX
    Runtime on the source with the compile's input shapes. Skipped when ONNX Runtime cannot load
    or run it (an operator only ATC has) or when it is over 2 GiB with its weights (too costly to
    run here; the CPU compiler's bound)."""
    import onnxruntime as ort

    folder = os.path.dirname(os.path.abspath(model_path))
    # (a weights file whose size cannot be read counts 0: ONNX Runtime's load below then fails, and skips it)
    if spec.model.ByteSize() + external_bytes(external_locations(spec.model), folder) > MAX_INLINE_BYTES:
        return
    model = onnx.ModelProto()
    model.CopyFrom(spec.model)  # (its inputs as the compile resolved them: a fixed-batch export made dynamic)
    drop_declared_shapes(model)  # an exporter's fixed-batch [1, 3] is not what a batch of 2 gives
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # (one load, four runs)
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:
        return
    names = [o.name for o in model.graph.output]
    refuse_mixed_rows(lambda feeds: sess.run(names, feeds), spec, names)


def _distinct_seeded_rows(t) -> np.ndarray:
    """Two rows of a fixed seed, different in every element: normal floats; 0/1 integers (safe
    as indices), the second row the first's complement."""
    rng = np.random.default_rng(0)
    shape = list(t.dims[1:])
    if np.issubdtype(t.dtype, np.floating):
        return rng.standard_normal([2] + shape).astype(t.dtype)
    first = rng.integers(0, 2, shape)
    return np.stack([first, 1 - first]).astype(t.dtype)


def _opposite_rows(t) -> np.ndarray:
    """A positive row and a negative one ten times its size: the sign of the batch's sum, mean,
    largest or smallest value, or a threshold on its size, is not each row's. Integers: ones and
    zeros (safe as indices)."""
    rng = np.random.default_rng(1)
    shape = list(t.dims[1:])
    if np.issubdtype(t.dtype, np.floating):
        return (np.abs(rng.standard_normal([2] + shape)) * np.reshape([1, -10], [2] + [1] * len(shape))).astype(t.dtype)
    return np.stack([np.ones(shape), np.zeros(shape)]).astype(t.dtype)


def _zero_and_one_rows(t) -> np.ndarray:
    shape = list(t.dims[1:])
    return np.stack([np.zeros(shape), np.ones(shape)]).astype(t.dtype)


def _difference(got, want) -> tuple[float | None, float | None, tuple | None] | None:
    """None when `got` is `want` within the tolerance, else (the largest difference, the output's
    magnitude, the (atol, rtol) applied), None for what cannot be said: another shape, a NaN or an
    infinity in one only; the magnitude and tolerance of an integer output (it must be equal)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return None, None, None
    a, b = got.astype(np.float64), want.astype(np.float64)
    if not np.issubdtype(want.dtype, np.floating):
        return None if np.array_equal(got, want) else (float(np.max(np.abs(a - b))), None, None)
    finite = np.isfinite(a) & np.isfinite(b)
    if not np.all(finite | (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))):
        return None, None, None
    magnitude = float(np.max(np.abs(b[finite]), initial=0))
    difference = float(np.max(np.abs(a[finite] - b[finite]), initial=0))
    atol, rtol = FP16_TOLERANCE if want.dtype == np.float16 else FLOAT_TOLERANCE
    return None if difference <= atol + rtol * magnitude else (difference, magnitude, (atol, rtol))


def _message(spec: ModelSpec, output: str, difference: float | None, magnitude: float | None,
             tolerance: tuple | None) -> str:
    inputs = ", ".join(repr(t.name) for t in spec.inputs)
    example = spec.atc_input_shape(batch="SIZE")  # (the ONNX model's inputs, not AIPP's pictures)
    # (how much, against what rounding accounts for: "(by 0.492; its values reach 0.432)" left a tester guessing)
    if difference is None:
        by = " (in its shape, or a NaN or an infinity in one run only)"
    elif tolerance is None:
        by = f" by up to {difference:.3g} (an integer output, which must be equal)"
    else:
        atol, rtol = tolerance
        by = (f" by up to {difference:.3g}, more than rounding accounts for ({atol + rtol * magnitude:.2g}: {atol:g} "
              f"+ {rtol:g} x {magnitude:.3g}, the largest absolute value of that output)")
    return (f"the rows of input{'s' if len(spec.inputs) > 1 else ''} {inputs} along the dynamic dimension 0 are not "
            f"independent: output {output!r} of a row run with another row differs from that row run alone{by}, "
            "so a batch would mix concurrent requests' answers; compile it for a static batch (--batch 1) or fix "
            f"that dimension with --input-shape \"{example}\", as ATC takes it{_training_hint(spec.model.graph)}")


def _training_hint(graph: onnx.GraphProto) -> str:
    """For a graph holding a BatchNormalization in training mode (its training_mode 1, or its
    running mean and variance among its outputs: opsets before 14 have no training_mode), which
    normalises each batch by its own statistics: the usual cause, an export without model.eval()
    (a tester, t96: told only to fix the batch)."""
    for node in graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        if any(a.name == "training_mode" and a.i for a in node.attribute) or sum(map(bool, node.output)) > 1:
            named = f" {node.name!r}" if node.name else ""
            return (f"; BatchNormalization node{named} is in training mode, normalising a batch by its own mean "
                    "and variance: the usual cause is an export without model.eval() (PyTorch's "
                    "torch.onnx.export of a model in training mode, or with training=TrainingMode.TRAINING): "
                    "export it again after model.eval()")
    return ""
