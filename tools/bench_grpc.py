"""The gRPC rows of bench_server.py: perf_analyzer as the load generator, tritonclient.grpc for
the output check.

perf_analyzer is Triton's C++ load generator (closed loop, one outstanding request per
concurrency slot, tritonclient's C++ gRPC client). It is not on PyPI as a working package; the
binary ships in tritonclient's manylinux wheels (2.50 runs on glibc 2.36). Pass its path or
put it on PATH. Each run is pinned with taskset like wrk, and its results are returned in the
shape of bench_wrk.Wrk.run's, so the benchmark's tables treat both generators alike.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import tempfile

import numpy as np

from bench_run import BenchFailed  # (tools/ is on the path of bench_server.py, which imports this)


def infer_grpc(address: str, model: str, input_name: str, output_name: str, sample: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(address) as client:
        x = grpcclient.InferInput(input_name, list(sample.shape), "FP32")
        x.set_data_from_numpy(sample)
        return client.infer(model, [x]).as_numpy(output_name)


INSTALLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "out", "perf-analyzer", "perf_analyzer")  # where install_perf_analyzer.py puts it


def find_perf_analyzer(explicit: str | None) -> str | None:
    """`explicit` when it runs, else perf_analyzer on PATH, else the one install_perf_analyzer.py
    installed in this checkout."""
    if explicit:
        # (which() as the run will: a bare name from PATH, a name with a folder as it is; a bare
        # name was checked in the current folder and then run from PATH, another program)
        found = shutil.which(explicit)
        return os.path.abspath(found) if found else None
    found = shutil.which("perf_analyzer")
    if found is None and os.access(INSTALLED, os.X_OK):
        found = INSTALLED
    return found


class PerfAnalyzer:
    """Runs `perf_analyzer -i grpc` pinned with taskset; owns a temp folder for its CSV reports,
    close() removes it (idempotent). run() blocks for about `seconds`."""

    TRIALS = 3  # measurement windows per run; perf_analyzer reports their mean

    def __init__(self, binary: str, cpus: str):
        self.binary, self.cpus = binary, cpus
        self._dir = tempfile.TemporaryDirectory(prefix="bench-pa-")
        self._n = 0

    def version(self) -> str:
        proc = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return (proc.stdout.strip() or "perf_analyzer").splitlines()[0]

    def run(self, address: str, model: str, concurrency: int, seconds: float) -> dict:
        """Closed loop at `concurrency` for about `seconds` (TRIALS windows, every one accepted as
        stable so the run length is fixed); one sample of random data per request."""
        self._n += 1
        report = os.path.join(self._dir.name, f"run{self._n}.csv")
        window_ms = max(500, int(seconds * 1000 / self.TRIALS))
        cmd = ["taskset", "-c", self.cpus, self.binary, "-m", model, "-i", "grpc", "-u", address,
               "-b", "1", "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
               "--max-trials", str(self.TRIALS), "--stability-percentage", "1000", "-f", report]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(report):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise BenchFailed(f"perf_analyzer failed ({proc.returncode}): {tail}")
        with open(report, newline="") as f:
            row = next(csv.DictReader(f))
        rps = float(row["Inferences/Second"])
        latency = {f"p{p}": float(row[f"p{p} latency"]) for p in (50, 90, 99)}
        # perf_analyzer stops with an error status on any failed request, so a report means none failed
        return {"rps": rps, "latency_us": latency, "requests": round(rps * window_ms * self.TRIALS / 1000),
                "socket_errors": 0, "errors": {"status": 0}, "non2xx": -1, "windows_ms": window_ms}

    def close(self) -> None:
        self._dir.cleanup()
