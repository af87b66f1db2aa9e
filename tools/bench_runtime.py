#!/usr/bin/env python3
"""Runtime benchmark: synchronous vs pipelined batches vs raw ONNX Runtime, per gear, one run.

For each gear of the heavier example model (the medium CNN, input [N,3,64,64]):
  sync      one batch at a time: pack, memcpy H2D, execute, memcpy D2H, unpack
  pipe2/3   the serving path (ModelInstance with 2 or 3 slots: launcher thread, three streams,
            completion thread), kept full by submitting every batch up front
  raw       onnxruntime.InferenceSession.run on the source ONNX at the same batch size
all with ONNX Runtime on `--threads` intra-op threads (default 1), and prints samples/s and the
ratios pipelined/sync and pipelined/raw measured in this run.

    python tools/bench_runtime.py [--model out/models/medium.onnx] [--seconds 2] [--gears 1,8,32]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aclserve.om.compile import compile_model  # noqa: E402
from aclserve.runtime import AclRuntime, open_pool  # noqa: E402
from aclserve.runtime.instance import Job  # noqa: E402
from bench_common import ensure_example_models, raw_session  # noqa: E402


def timed(fn, seconds: float, min_runs: int = 5) -> tuple[int, float]:
    """Call fn() (returns samples done) until `seconds` passed and min_runs ran; (samples, elapsed)."""
    fn()  # warm-up
    samples, runs, start = 0, 0, time.perf_counter()
    while runs < min_runs or time.perf_counter() - start < seconds:
        samples += fn()
        runs += 1
    return samples, time.perf_counter() - start


def bench_raw(onnx_path: str, gear: int, seconds: float, threads: int) -> float:
    sess = raw_session(onnx_path, threads)
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((gear, *sess.get_inputs()[0].shape[1:])).astype(np.float32)

    def run():
        sess.run(None, {name: x})
        return gear
    samples, elapsed = timed(run, seconds)
    return samples / elapsed


def bench_sync(runtime, om: str, gear: int, seconds: float) -> float:
    pool = open_pool(runtime, om, "sync", slots=1)
    try:
        instance = pool.instances[0]
        request = {s.name: np.random.default_rng(1).standard_normal((gear,) + s.sample_shape).astype(s.dtype)
                   for s in pool.inputs}

        def run():
            instance.run_sync(Job([request], gear, gear))
            return gear
        samples, elapsed = timed(run, seconds)
        return samples / elapsed
    finally:
        pool.close()


def bench_pipelined(runtime, om: str, gear: int, seconds: float, slots: int) -> float:
    pool = open_pool(runtime, om, f"pipe{slots}", slots=slots)
    try:
        request = {s.name: np.random.default_rng(1).standard_normal((gear,) + s.sample_shape).astype(s.dtype)
                   for s in pool.inputs}
        pool.submit([request], gear).result()
        per_round = max(4 * slots, 8)

        def run():
            futures = [pool.submit([request], gear) for _ in range(per_round)]
            for f in futures:
                f.result()
            return gear * per_round
        samples, elapsed = timed(run, seconds, min_runs=2)
        return samples / elapsed
    finally:
        pool.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "out", "models", "medium.onnx"))
    ap.add_argument("--gears", default="1,2,4,8,16,32")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (both sides)")
    args = ap.parse_args()
    gears = [int(g) for g in args.gears.split(",")]
    onnx_path = args.model
    if not os.path.exists(onnx_path):
        ensure_example_models(os.path.dirname(onnx_path))
    with tempfile.TemporaryDirectory() as tmp:
        om = os.path.join(tmp, "model.om")
        compile_model(onnx_path, om, batch=gears, target="cpu", log=lambda _: None)
        rt = AclRuntime(device="cpu", cpu_threads=args.threads).start()
        try:
            print(f"model {os.path.relpath(onnx_path, ROOT)}, ORT threads {args.threads}, "
                  f"{args.seconds:g} s per cell, cpus {os.cpu_count()}")
            print(f"{'gear':>4} {'raw':>9} {'sync':>9} {'pipe2':>9} {'pipe3':>9}  "
                  f"{'pipe2/sync':>10} {'pipe3/sync':>10} {'pipe2/raw':>9} {'pipe3/raw':>9}")
            for gear in gears:
                raw = bench_raw(onnx_path, gear, args.seconds, args.threads)
                sync = bench_sync(rt, om, gear, args.seconds)
                p2 = bench_pipelined(rt, om, gear, args.seconds, 2)
                p3 = bench_pipelined(rt, om, gear, args.seconds, 3)
                print(f"{gear:>4} {raw:>9.0f} {sync:>9.0f} {p2:>9.0f} {p3:>9.0f}  "
                      f"{p2 / sync:>10.2f} {p3 / sync:>10.2f} {p2 / raw:>9.2f} {p3 / raw:>9.2f}", flush=True)
        finally:
            rt.close()
    print("samples/s; raw = onnxruntime InferenceSession.run on the source ONNX, same thread count")
    return 0


if __name__ == "__main__":
    sys.exit(main())
