"""Build a CPU OM from a resolved ModelSpec: shape inference, output specs, offline ORT
optimisation, header. Returns (header, payload); the caller writes the container.

Optimisation level: ORT_ENABLE_EXTENDED. Extended fusions may emit ONNX Runtime contrib ops
(com.microsoft FusedConv, FusedGemm, ...), which every ONNX Runtime CPU execution provider runs;
the layout level (ORT_ENABLE_ALL, NCHWc) is left out because it bakes in the vector width of
the compiling machine, which would make the file unportable.

Output shapes come from running the optimised model once per probe batch (a dynamic batch's
every size up to 32 rows, none larger: probe_sizes.py) on zero inputs (on ones if that fails: a division
by an input), what ONNX Runtime will compute, not what the exporter declared nor what shape
inference guesses; an output that is not [batch, fixed...] (or fully fixed for a static model)
is refused, since the runtime must size output buffers per gear, and so is a model that cannot
run at all, and one whose output sizes change with the input's values (a second probe run on
other values), and a dynamic-batch model whose rows are not independent (batch_rows.py: a batch
would mix concurrent requests).
"""
from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import os

import numpy as np
import onnx
from onnx import shape_inference

from .._version import __version__
from ..dtypes import ACL_INT64
from .batch_rows import refuse_mixed_rows
from . import probe_sizes
from .container import DYNAMIC_BATCH_INPUT
from .data_sized import refuse_data_sized
from .declared_shapes import drop_declared_shapes
from .names import atc_output_names
from .spec import CompileError, ModelSpec, TensorInfo, dtype_of, one_line, refuse_empty
from .traced_batch import traced_batch_hint
from .work_folder import work_folder

ORT_LEVEL = "extended"
PROBE_FILLS = (np.zeros, np.ones)  # what output shapes are read on: ones where zeros cannot run
_MAX_PROTO_BYTES = 2**31 - 1


def dynamic_batch_input() -> dict:
    """The extra input ATC adds to a dynamic-batch model (header only, not in the ONNX graph)."""
    return {"name": DYNAMIC_BATCH_INPUT, "datatype": "INT64", "acl_dtype": ACL_INT64,
            "format": "ND", "dims": [1], "dynamic_batch": True}


def output_types(spec: ModelSpec) -> list[TensorInfo]:
    """The outputs' names and dtypes (shape inference's, for an output that declares none); their
    shapes are left to probe_outputs. The outputs' declared shapes, and those the graph declares
    for its intermediate values, are dropped first (from spec.model: the OM's graph then checks
    none): they are the exporter's word, and a fixed-batch export's [1, 3] made dynamic, or a
    shape the graph does not compute, compiled and then failed every run ("invalid dimensions for
    output"), the model retried for good as a device fault."""
    drop_declared_shapes(spec.model)  # (a torch export's fixed-batch [1, 3] for each one)
    try:
        inferred = shape_inference.infer_shapes(spec.model, strict_mode=False, data_prop=True)
    except Exception as e:
        raise CompileError(f"ONNX shape inference failed: {one_line(e)}") from None
    refuse_data_sized(inferred, spec)  # (before the test runs, which cannot find every such output)
    return [TensorInfo(vi.name, dtype_of(vi, "output"), []) for vi in inferred.graph.output]


def optimise(model: onnx.ModelProto, refused_hint: str = "") -> bytes:
    """Run ONNX Runtime's offline optimiser; return the serialised optimised model. `refused_hint`
    ends the refusal of a model it cannot load."""
    import onnxruntime as ort

    data = model.SerializeToString()
    if len(data) > _MAX_PROTO_BYTES:
        raise CompileError("models over 2 GiB (external weights) are not supported by the CPU compiler")
    with work_folder() as tmp:  # (removed by a later compile if this one is killed outright)
        out = os.path.join(tmp, "optimised.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = out
        so.intra_op_num_threads = 1
        so.log_severity_level = 4  # (its refusal is said in the CompileError: on stderr it came in ANSI colours too)
        try:
            ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            _refuse_full_temp_folder(out, len(data))
            raise CompileError(f"ONNX Runtime cannot load the model: {one_line(e)}{refused_hint}") from None
        with open(out, "rb") as f:
            return f.read()


def _refuse_full_temp_folder(out: str, size: int) -> None:
    """A session that failed where the temp folder has not the room for `out`, about `size` bytes:
    the host short of disk (ENOSPC, retried), not a broken model. ONNX Runtime says only
    "Protobuf serialization failed" when it cannot write it (a tester's 200 MB TMPDIR, 320 MB model)."""
    try:
        disk = os.statvfs(os.path.dirname(out))
        written = os.path.getsize(out) if os.path.exists(out) else 0  # (its partial file holds some of the room)
    except OSError:
        return
    if disk.f_bavail * disk.f_frsize + written < size:
        raise OSError(errno.ENOSPC, f"No space left on device for an optimised model about as large as the model "
                                    f"({size:,} bytes) in the temp folder (TMPDIR)",
                      os.path.dirname(os.path.dirname(out)))


def probe_outputs(payload: bytes, spec: ModelSpec, outputs: list[TensorInfo]) -> tuple[list[TensorInfo], list[str]]:
    """Read output shapes by running the model on zeros, else on ones: a model dividing by an
    input cannot run on zeros (what `warmup_data: ones` is for, which the warnings returned then
    say). A dynamic batch runs at each of its
    small batch sizes whatever larger ones are compiled (probe_sizes.py). A model that cannot run at all (a
    sequence longer than its position table: a broadcast that fails) is refused here, as ATC's own
    shape checks refuse it, not retried for good as a device fault at its warm-up."""
    sess = _session(payload)
    batches = probe_sizes.probe_batches(spec)
    try:
        seen, fill, on_zeros = _probe_runs(sess, spec, outputs, batches)
    except CompileError:
        if not spec.gears or set(batches) <= set(spec.gears):  # (run at sizes asked for: refused)
            raise
        batches = spec.gears[:2]  # (a model that runs at its sizes only: a Reshape of rows into fours)
        seen, fill, on_zeros = _probe_runs(sess, spec, outputs, batches)
    _refuse_data_dependent(sess, spec, outputs, batches[0], fill, seen[0])
    fixed = []
    for i, o in enumerate(outputs):
        shapes = [s[i] for s in seen]
        if spec.dynamic_batch:
            if any(len(s) == 0 or s[0] != b for s, b in zip(shapes, batches)) or len({s[1:] for s in shapes}) != 1:
                _refuse_some_sizes(o.name, shapes, batches, spec.gears)
                raise CompileError(f"output {o.name!r} is not batch-major (shapes {[list(s) for s in shapes]} for "
                                   f"batch sizes {batches}); every output of a dynamic-batch model needs the "
                                   f"batch first (or compile it for one batch size: --batch 1){spec.fixed_dim0_hint()}")
            fixed.append(TensorInfo(o.name, o.dtype, [-1] + list(shapes[0][1:])))
        else:
            fixed.append(TensorInfo(o.name, o.dtype, list(shapes[0])))
    if spec.dynamic_batch:
        names = [o.name for o in outputs]
        refuse_mixed_rows(lambda feeds: sess.run(names, feeds), spec, names)
    if on_zeros is None:
        return fixed, []
    # (the compile knew and said nothing: the server's warm-up then failed on zeros; found by a tester)
    return fixed, [f"the model cannot run on zeros (a test run on zeros{on_zeros}), so its test runs ran on ones: "
                   "serve it with `warmup_data: ones` in its config (the server's warm-up runs every gear on "
                   "zeros unless told, and would fail)"]


def _refuse_some_sizes(name: str, shapes: list[tuple], batches: list[int], gears: list[int]) -> None:
    """An output batch-major at some of the sizes run and not at others (a Slice capping it at 2
    rows): said as the sizes the model runs at, which it may be compiled for."""
    def fits(shape, batch) -> bool:
        return len(shape) > 0 and shape[0] == batch and shape[1:] == shapes[0][1:]
    good = [b for s, b in zip(shapes, batches) if fits(s, b)]
    bad = [b for s, b in zip(shapes, batches) if not fits(s, b)]
    if not good or not fits(shapes[0], batches[0]):
        return
    asked = [g for g in good if g in gears]
    remedy = f"; compile it for those (--batch {','.join(map(str, asked))})" if asked else ""
    raise CompileError(f"output {name!r} does not follow the batch at batch size {bad[0]} (shapes "
                       f"{[list(s) for s in shapes]} for batch sizes {batches}): it follows the batch at batch "
                       f"sizes {', '.join(map(str, good))} only{remedy}")


def _session(model: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4  # (a failed run is said in the CompileError, not also on stderr)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _probe_runs(sess, spec: ModelSpec, outputs: list[TensorInfo], batches: list) -> tuple[list[list[tuple]], object,
                                                                                          str | None]:
    """The outputs' shapes at each batch size, the fill they ran on (zeros, else ones) and, when
    ones, how the run on zeros failed. A refusal names the size that failed, of the fill that ran
    furthest (zeros on a tie)."""
    names = [o.name for o in outputs]
    failures = []  # (sizes that ran, fill, error) of each fill
    for fill in PROBE_FILLS:
        seen: list[list[tuple]] = []
        try:
            for batch in batches:
                seen.append([r.shape for r in sess.run(names, _probe_feeds(spec, batch, fill))])
            if not failures:
                return seen, fill, None
            ran, _, error = failures[0]
            at = "" if batches == [None] else f" at batch size {batches[ran]}"
            return seen, fill, f"{at} failed: {one_line(error)}"
        except Exception as e:
            failures.append((len(seen), fill, e))
    ran, fill, failure = max(failures, key=lambda f: f[0])  # (max keeps the first of a tie)
    at = "" if batches == [None] else f" at batch size {batches[ran]}"
    if all(f[0] == ran for f in failures):
        on = "(on zeros, then ones)"
    else:  # (zeros failed sooner: a division by an input, say; said apart from the reason shown)
        on = f"on {fill.__name__} (on zeros at batch size {batches[failures[0][0]]})"
    before = f" (batch sizes {', '.join(map(str, batches[:ran]))} ran)" if ran else ""
    raise CompileError(f"a test run of the model {on}{at} failed{before}: {one_line(failure)}"
                       f"{_traced_batch(spec, batches[ran])}")


def _traced_batch(spec: ModelSpec, batch: int | None) -> str:
    """traced_batch_hint for a run of `spec` at `batch` (None: a static model's own size) that
    failed: a batch size the export traced into its graph, which ONNX Runtime's refusal names not."""
    if batch is None:
        batch = next(iter((spec.model_inputs or spec.inputs)[0].dims), None)
    return traced_batch_hint(spec.model.graph, spec.exported_batch, batch)


def _refuse_data_dependent(sess, spec: ModelSpec, outputs: list[TensorInfo], batch: int | None, used,
                           shapes: list[tuple]) -> None:
    """Run the model again on other values (those it cannot run on are skipped): an output whose
    size follows the data (NonZero, NonMaxSuppression: a detection model's boxes) compiled with
    the size of one probe run, and every request finding another count failed as a device
    fault (found by a helper). An OM's outputs have the sizes fixed at compile."""
    at = "" if batch is None else f", batch size {batch}"
    for fill in PROBE_FILLS + (_seeded_values,):
        if fill is used:
            continue
        try:
            other = [r.shape for r in sess.run([o.name for o in outputs], _probe_feeds(spec, batch, fill))]
        except Exception:
            continue
        for o, a, b in zip(outputs, shapes, other):
            if a != b:
                raise CompileError(
                    f"output {o.name!r} changes size with the input's values (shape {list(a)} on {used.__name__}, "
                    f"{list(b)} on {fill.__name__.strip('_').replace('_', ' ')}{at}): an OM's outputs "
                    "have the sizes fixed when it is compiled; bound the output in the graph (e.g. pad it to a "
                    "fixed count with TopK)")


def _seeded_values(shape, dtype) -> np.ndarray:
    """Values of a fixed seed, small enough for an index input (0 or 1) or a float (normal)."""
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _probe_feeds(spec: ModelSpec, batch: int | None, fill) -> dict:
    return {t.name: fill([batch if d == -1 else d for d in t.dims], t.dtype) for t in spec.inputs}


def _created() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # reproducible builds
    when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch else _dt.datetime.now(_dt.timezone.utc)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build(spec: ModelSpec, *, name: str, source_path: str, source_bytes: bytes,
          options: dict) -> tuple[dict, bytes, list[str]]:
    """Return (header, payload, warnings) for a CPU OM of `spec` (warnings: what its test runs
    found that serving it needs, one line each)."""
    import onnxruntime as ort

    types = output_types(spec)  # (first: it drops the declared shapes the optimised graph would check)
    # (a static batch, every size known: ONNX Runtime's shape inference refuses one the export traced at load)
    payload = optimise(spec.model, "" if spec.dynamic_batch else _traced_batch(spec, None))
    outputs, warnings = probe_outputs(payload, spec, types)
    for output in outputs:
        refuse_empty("output", output.name, output.dims)
    inputs = [t.header_entry(is_input=True) for t in spec.inputs]
    if spec.dynamic_batch:
        inputs.append(dynamic_batch_input())
    reported = atc_output_names(spec.model)  # what an ATC OM of this model would report
    output_entries = [dict(o.header_entry(), atc_name=reported.get(o.name, o.name)) for o in outputs]
    header = {
        "name": name,
        "producer": f"aclserve {__version__} cpu",
        "created": _created(),
        "source": {"path": source_path, "sha256": hashlib.sha256(source_bytes).hexdigest()},
        "inputs": inputs,
        "outputs": output_entries,
        "gears": list(spec.gears),
        "options": dict(options, target="cpu", ort_optimization=ORT_LEVEL, onnxruntime=ort.__version__),
    }
    return header, payload, warnings
