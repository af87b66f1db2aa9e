#!/usr/bin/env python3
"""Runtime benchmark: synchronous vs pipelined batches vs raw ONNX Runtime, per gear, one run.

For each gear of the heavier example model (the medium CNN, input [N,3,64,64]):
  sync      one batch at a time: pack, memcpy H2D, execute, memcpy D2H, unpack
  pipe2/3   the serving path (ModelInstance with 2 or 3 slots: launcher thread, three streams,
            completion thread), kept full by submitting every batch up front
  raw       onnxruntime.InferenceSession.run on the source ONNX at the same batch size
all with ONNX Runtime on `--threads` intra-op threads (default 1), and prints samples/s and the
ratios pipelined/sync and pipelined/raw measured in this run.

`--idle` measures instead how much of the wall time the device sat idle on each path, on a model
whose copies are not negligible (an image model taking [N,3,512,512] FP32, 3 MiB per sample, built
here): idle = 1 - device compute time / wall time, where compute time is the sum of the batches'
event_elapsed_time(exec_start, exec_end) on the pipelined paths, and the blocking execute's wall
time on the synchronous path (it has no events; the call returns when the device is done).

    python tools/bench_runtime.py [--model out/models/medium.onnx] [--seconds 2] [--gears 1,8,32]
    python tools/bench_runtime.py --idle [--gears 1,4] [--seconds 3] [--chart idle.png]
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
from aclserve.runtime import Batch  # noqa: E402
from aclserve.runtime.futures import BatchFutures  # noqa: E402
from bench_args import gears, positive_float, positive_int  # noqa: E402
from bench_batching import MEASURED  # noqa: E402  (the failures of a measurement in process, as there)
from bench_models import MODEL_NAMES, ensure_example_models, ensure_model, raw_session  # noqa: E402
from bench_run import run_tool  # noqa: E402


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


def gear_of(pool, gear: int) -> int | None:
    """The batch's gear: None for a static model (--gears with one size compiles one)."""
    return gear if pool.gears else None


def random_request(pool, gear: int) -> dict[str, np.ndarray]:
    """One request of `gear` rows of seeded random data for every input of the pool's model (a static
    model's input shape, which one gear compiles, has its rows already)."""
    return {s.name: np.random.default_rng(1).standard_normal((gear,) + s.sample_shape if s.batched else s.shape)
            .astype(s.dtype) for s in pool.inputs}


def bench_sync(runtime, om: str, gear: int, seconds: float) -> float:
    pool = open_pool(runtime, om, "sync", slots=1)
    try:
        instance = pool.instances[0]
        request = random_request(pool, gear)

        def run():
            instance.run_sync(Batch([request], gear_of(pool, gear), gear))
            return gear
        samples, elapsed = timed(run, seconds)
        return samples / elapsed
    finally:
        pool.close()


def bench_pipelined(runtime, om: str, gear: int, seconds: float, slots: int) -> float:
    pool = open_pool(runtime, om, f"pipe{slots}", slots=slots)
    try:
        request = random_request(pool, gear)
        futures = BatchFutures(pool)
        futures.submit([request], gear_of(pool, gear)).result()
        per_round = max(4 * slots, 8)

        def run():
            for f in [futures.submit([request], gear_of(pool, gear)) for _ in range(per_round)]:
                f.result()
            return gear * per_round
        samples, elapsed = timed(run, seconds, min_runs=2)
        return samples / elapsed
    finally:
        pool.close()


def image_onnx(path: str) -> str:
    """x [N,3,512,512] -> conv 8x8/8 (16) -> relu -> conv 3x3/2 (32) -> relu -> mean -> fc 10."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    w = lambda *shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32))  # noqa: E731
    inits = [w(16, 3, 8, 8), w(32, 16, 3, 3), w(32, 10), w(10)]
    for init, name in zip(inits, ("c1", "c2", "fc", "b")):
        init.name = name
    nodes = [helper.make_node("Conv", ["x", "c1"], ["a"], strides=[8, 8]), helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Conv", ["ra", "c2"], ["c"], strides=[2, 2]), helper.make_node("Relu", ["c"], ["rc"]),
             helper.make_node("GlobalAveragePool", ["rc"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "b"], ["y"])]
    graph = helper.make_graph(nodes, "image512", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def idle_sync(runtime, om: str, gear: int, seconds: float) -> tuple[float, float]:
    """(samples/s, idle fraction) of the synchronous path."""
    pool = open_pool(runtime, om, "sync", slots=1)
    try:
        instance = pool.instances[0]
        request = random_request(pool, gear)
        busy = [0.0]

        def run():
            busy[0] += instance.run_sync(Batch([request], gear_of(pool, gear), gear)).timings.compute_ms / 1000
            return gear
        run()
        busy[0] = 0.0
        samples, elapsed = timed(run, seconds)
        return samples / elapsed, 1 - busy[0] / elapsed
    finally:
        pool.close()


def idle_pipelined(runtime, om: str, gear: int, seconds: float, slots: int) -> tuple[float, float]:
    """(samples/s, idle fraction) of the serving path kept full (`slots` batches in flight)."""
    pool = open_pool(runtime, om, f"pipe{slots}", slots=slots)
    try:
        request = random_request(pool, gear)
        futures = BatchFutures(pool)
        futures.submit([request], gear_of(pool, gear)).result()
        in_flight = [futures.submit([request], gear_of(pool, gear)) for _ in range(slots)]
        busy, samples, start = 0.0, 0, time.perf_counter()
        while time.perf_counter() - start < seconds or samples < 5 * gear:
            busy += in_flight.pop(0).result().timings.compute_ms / 1000
            samples += gear
            in_flight.append(futures.submit([request], gear_of(pool, gear)))
        elapsed = time.perf_counter() - start
        for future in in_flight:  # they end after the window: neither their samples nor their compute count
            future.result()
        return samples / elapsed, max(0.0, 1 - busy / elapsed)
    finally:
        pool.close()


def main_idle(args, gears: list[int]) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        onnx_path = image_onnx(os.path.join(tmp, "image512.onnx"))
        om = os.path.join(tmp, "image512.om")
        compile_model(onnx_path, om, batch=gears, target="cpu", log=lambda _: None)
        rt = AclRuntime(device="cpu", cpu_threads=args.threads).start()
        rows = []
        try:
            print(f"image model [N,3,512,512] FP32 (3 MiB per sample), ORT threads {args.threads}, "
                  f"{args.seconds:g} s per cell, cpus {os.cpu_count()}")
            print(f"{'gear':>4} {'sync/s':>8} {'idle':>6} {'pipe2/s':>8} {'idle':>6} {'pipe3/s':>8} {'idle':>6}",
                  flush=True)
            for gear in gears:
                cells = [idle_sync(rt, om, gear, args.seconds)] + [
                    idle_pipelined(rt, om, gear, args.seconds, slots) for slots in (2, 3)]
                rows.append((gear, cells))
                print(f"{gear:>4} " + " ".join(f"{rate:>8.1f} {idle:>6.1%}" for rate, idle in cells), flush=True)
        finally:
            rt.close()
    print("idle = 1 - device compute time / wall time (events on the pipelined paths, the blocking "
          "execute on the synchronous one)")
    if args.chart:
        from charts import bar_chart
        bar_chart(args.chart, "device idle fraction, image model 3x512x512",
                  [f"gear {g}" for g, _ in rows], {name: [cells[i][1] * 100 for _, cells in rows]
                                                   for i, name in enumerate(("sync", "pipelined, 2 slots", "pipelined, 3 slots"))},
                  "% of wall time the device was idle")
        print(f"chart: {args.chart}")
    return 0


def check_model(ap: argparse.ArgumentParser, model: str) -> None:
    """--model: an example model's name, an example model's file (built where it is named if
    missing: model_path), or an ONNX file that exists."""
    if model not in MODEL_NAMES and not os.path.exists(model) \
            and os.path.basename(model) not in {f"{name}.onnx" for name in MODEL_NAMES}:
        ap.error(f"--model {model}: no such file (or one of {', '.join(MODEL_NAMES)})")


def model_path(model: str) -> str:
    """The ONNX file of a checked --model, an example model built if missing."""
    if model in MODEL_NAMES:
        return ensure_model(model)
    if not os.path.exists(model):
        ensure_example_models(os.path.dirname(os.path.abspath(model)))  # (the builder runs in the checkout)
    return model


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "out", "models", "medium.onnx"),
                    help=f"an ONNX file, or an example model: {', '.join(MODEL_NAMES)} (default: medium's file)")
    ap.add_argument("--gears", type=gears, default=None, help="default 1,2,4,8,16,32 (--idle: 1,4)")
    ap.add_argument("--seconds", type=positive_float, default=2.0)
    ap.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime intra-op threads (both sides)")
    ap.add_argument("--idle", action="store_true", help="device idle fraction, sync vs pipelined, image model")
    ap.add_argument("--chart", metavar="PNG", help="with --idle: also draw the table as a bar chart (matplotlib)")
    args = ap.parse_args(argv)
    if args.chart and not args.idle:  # (the runtime table has no chart: it ran a minute for nothing)
        ap.error("--chart draws the --idle table: give --idle too")
    if not args.idle:
        check_model(ap, args.model)
    # (checked by the compile's own parser: bench_args.gears)
    default = "1,4" if args.idle else "1,2,4,8,16,32"
    args.gears = [int(g) for g in (args.gears or default).split(",")]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("bench_runtime", lambda: run(args), MEASURED)


def run(args) -> int:
    if args.idle:
        return main_idle(args, args.gears)
    gears = args.gears
    onnx_path = model_path(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        om = os.path.join(tmp, "model.om")
        compile_model(onnx_path, om, batch=gears, target="cpu", log=lambda _: None)
        rt = AclRuntime(device="cpu", cpu_threads=args.threads).start()
        try:
            print(f"model {os.path.relpath(onnx_path, ROOT)}, ORT threads {args.threads}, "
                  f"{args.seconds:g} s per cell, cpus {os.cpu_count()}")
            print(f"{'gear':>4} {'raw':>9} {'sync':>9} {'pipe2':>9} {'pipe3':>9}  "
                  f"{'pipe2/sync':>10} {'pipe3/sync':>10} {'pipe2/raw':>9} {'pipe3/raw':>9}", flush=True)
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
