"""The benchmarks' models and their raw ONNX Runtime baseline: the example models of
tools/make_example_models.py (built into out/models/ when missing), and InferenceSession runs on
their source ONNX with the CPU runtime's session options, timed per batch size."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

# ONNX Runtime reads it when first imported (raw runs import it before any aclserve module,
# which sets the same: aclserve/__init__.py); ORT_DISABLE_TELEMETRY=0 keeps telemetry on
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

TOOLS = os.path.dirname(os.path.abspath(__file__))
MODEL_NAMES = ("light", "medium", "heavy")


def ensure_example_models(outdir: str) -> dict[str, str]:
    """Build the benchmark models (tools/make_example_models.py) into `outdir` unless they are
    there; name -> absolute ONNX path. A relative `outdir` is the caller's: the builder, and the
    compiles and servers of the tools, run in the repository's root."""
    outdir = os.path.abspath(outdir)
    paths = {m: os.path.join(outdir, f"{m}.onnx") for m in MODEL_NAMES}
    if not all(os.path.exists(p) for p in paths.values()):
        subprocess.run([sys.executable, os.path.join(TOOLS, "make_example_models.py"), outdir, "--skip-digits"],
                       check=True, cwd=os.path.dirname(TOOLS))
    return paths


def ensure_model(name: str) -> str:
    """The ONNX path of example model `name` in out/models/, built there if missing."""
    return ensure_example_models(os.path.join(os.path.dirname(TOOLS), "out", "models"))[name]


def raw_session(onnx_path: str, threads: int):
    """An InferenceSession with the settings the CPU runtime uses (the raw baseline)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])


class RawOrt:
    """InferenceSession.run on the source ONNX with the server's session options, timed on the
    given CPUs (this process's affinity is set for the measurement and restored). Caches the
    median seconds per batch size, so each size is measured once per run of the tool."""

    def __init__(self, onnx_path: str, threads: int, cpus: set[int], min_s: float = 0.5, min_runs: int = 20):
        self.session = raw_session(onnx_path, threads)
        self.input = self.session.get_inputs()[0]
        self.output_name = self.session.get_outputs()[0].name
        self.sample_shape = [int(d) for d in self.input.shape[1:]]
        self.cpus, self.min_s, self.min_runs = cpus, min_s, min_runs
        self._median: dict[int, float] = {}

    def infer(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input.name: x})[0]

    def seconds_per_batch(self, batch: int) -> float:
        """Median time of one run at `batch`, over >= min_s seconds and >= min_runs runs."""
        if batch not in self._median:
            x = np.random.default_rng(batch).standard_normal([batch, *self.sample_shape]).astype(np.float32)
            feed = {self.input.name: x}
            saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)
            try:
                self.session.run(None, feed)  # warm-up
                times, start = [], time.perf_counter()
                while len(times) < self.min_runs or time.perf_counter() - start < self.min_s:
                    t0 = time.perf_counter()
                    self.session.run(None, feed)
                    times.append(time.perf_counter() - t0)
            finally:
                os.sched_setaffinity(0, saved)
            self._median[batch] = float(np.median(times))
        return self._median[batch]

    def samples_per_s_at_mix(self, mix: dict[int, int]) -> float:
        """Total samples / total raw time for `mix` (batch size -> executions)."""
        samples = sum(b * n for b, n in mix.items())
        seconds = sum(self.seconds_per_batch(b) * n for b, n in mix.items())
        return samples / seconds if seconds else 0.0
