#!/usr/bin/env python3
"""Decode-heavy serving: JPEGs in, with the decode pool (images.workers > 0) and decoding inline
on the event loop (images.workers = 0), side by side in one run.

Model: the medium CNN of tools/make_example_models.py (3 x 64 x 64) compiled to a CPU OM with
static AIPP (RGB, ImageNet mean/std), so the host sends uint8 pixels; its image input centre-
crops each picture to 64 x 64. Pictures: scikit-learn's two sample photos (640 x 427) as JPEG
q90, four per request (--images-per-request), binary BYTES framing. For each mode a server runs
as a child process (unpinned: decode threads, the event loop and the compute stream share the
machine's cores) and wrk posts the same request from `--clients` connections, then one image per
request from one connection. Reported: images/s, the device busy fraction (compute_infer time of
the model's statistics over the window, from the warm-up's last batch done to the load's: the
CPU runtime's compute stream), the mean batch, the p50 of a small numeric request to another
model (digits) sent meanwhile from one more connection (does the event loop stay responsive?),
and p50 / p99 latency at one client sending one JPEG, and p50 at one client sending as many as
the load's requests. Also the single-thread cost of one decode + crop and of the model's compute
per image, to read the figures against. A run with failed requests (the errors column: wrk's
socket errors and answers >= 400) says so and exits 1; a server that dies during a mode ends the
run in one error line, exit status 1; Ctrl-C or SIGTERM stop it and remove the run's folders,
exit 130 (tools/bench_run.py).

Usage: pip install -e '.[tools]' && python tools/bench_images.py [--seconds 10] [--workers 2]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, ROOT)
sys.path.insert(0, TOOLS)

from bench_args import positive_int, whole_seconds  # noqa: E402
from bench_bodies import HEADER_LENGTH  # noqa: E402
from bench_common import ManagedProcess, free_port, http, wait_ready  # noqa: E402
from bench_models import RawOrt, ensure_example_models  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_tool  # noqa: E402
from bench_wrk import Body, Wrk, require_wrk  # noqa: E402

YAML = "inputs:\n  x:\n    image: {resize: center_crop, crop_fraction: 0.875}\n"


def photos() -> list[bytes]:
    from PIL import Image
    from sklearn.datasets import load_sample_image

    out = []
    for name in ("china.jpg", "flower.jpg"):
        buf = io.BytesIO()
        Image.fromarray(load_sample_image(name)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def bytes_body(images: list[bytes]) -> Body:
    chunk = b"".join(struct.pack("<I", len(i)) + i for i in images)
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [len(images), 1],
                                   "parameters": {"binary_data_size": len(chunk)}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}).encode()
    return Body(head + chunk, "application/octet-stream", f"{HEADER_LENGTH}: {len(head)}")


def build_repository(repo: str, models_dir: str) -> str:
    from aclserve.om import aipp
    from aclserve.om.compile import compile_model

    onnx_path = ensure_example_models(models_dir)["medium"]
    ops = [aipp.generate("rgb", "123.675,116.28,103.53", "58.395,57.12,57.375")]
    compile_model(onnx_path, os.path.join(repo, "medium_image.om"), target="cpu", aipp=ops, log=lambda s: None)
    with open(os.path.join(repo, "medium_image.yaml"), "w") as f:
        f.write(YAML)
    shutil.copy(os.path.join(ROOT, "models", "digits.om"), os.path.join(repo, "digits.om"))
    return onnx_path


def digits_body() -> Body:
    x = np.load(os.path.join(ROOT, "tests", "data", "digits_test.npz"))["x"][:1]
    raw = np.ascontiguousarray(x, "<f4").tobytes()
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return Body(head + raw, "application/octet-stream", f"{HEADER_LENGTH}: {len(head)}")


def unit_costs(onnx_path: str, pictures: list[bytes]) -> tuple[float, float]:
    """(ms per decode + crop on one thread, ms of compute per image at batch 4)."""
    from aclserve.config import ImageInput
    from aclserve.images.decode import decode_pixels
    from aclserve.images.plan import build_plan
    from aclserve.runtime.types import TensorSpec

    plan = build_plan(ImageInput(resize="center_crop", crop_fraction=0.875),
                      TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, 64, 64, 3), "NHWC"))
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        decode_pixels(pictures[n % len(pictures)], plan, 40_000_000, 16384)
        n += 1
    decode_ms = (time.perf_counter() - start) / n * 1e3
    raw = RawOrt(onnx_path, 1, os.sched_getaffinity(0))
    return decode_ms, raw.seconds_per_batch(4) / 4 * 1e3


def stats(base: str) -> dict:
    entry = json.loads(http(f"{base}/v2/models/medium_image/stats"))["model_stats"][0]
    # per executed batch (inference_stats counts each request's share of its batch's time)
    return {"infer_ns": sum(b["compute_infer"]["ns"] for b in entry["batch_stats"]), "rows": entry["inference_count"],
            "runs": entry["execution_count"]}


def settled_stats(base: str, settle_s: float = 0.5, limit_s: float = 60.0) -> tuple[dict, float]:
    """The model's stats once no batch has completed for `settle_s` (a load's requests still
    queued, decoding or running when its clients stop are done by then), and when those were
    first read: every batch they count had completed by that time. Raises when they have not
    settled within `limit_s` (another client of the server: the window would not be this run's)."""
    last, seen = stats(base), time.monotonic()
    give_up = seen + limit_s
    while time.monotonic() - seen < settle_s:
        if time.monotonic() > give_up:
            raise BenchFailed(f"the model's statistics did not settle within {limit_s:g} s: another client?")
        time.sleep(0.05)
        now = stats(base)
        if now != last:
            last, seen = now, time.monotonic()
    return last, seen


def run_mode(workers: int, args, tmp: str, wrks: tuple[Wrk, Wrk], bodies: dict[str, Body]) -> dict:
    cfg = os.path.join(tmp, f"server{workers}.yaml")
    with open(cfg, "w") as f:
        f.write(f"images: {{workers: {workers}, max_pending: 1024}}\nmodel_defaults:\n"
                f"  batching: {{max_queue_delay_ms: 1}}\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    mode = f"the {'pool' if workers else 'inline'} mode"
    # the prober's thread is joined once the server is stopped (closing's exit comes first)
    with ThreadPoolExecutor(1) as background, closing(ManagedProcess(
            [sys.executable, "-m", "aclserve", "serve", "--config", cfg, "--models", os.path.join(tmp, "repo"),
             "--port", str(port), "--grpc-port", "0", "--model-control-mode", "none", "--log-level", "warning"],
            os.path.join(tmp, f"server{workers}.log"), cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))) as server:
        wait_ready(server, base, 120)
        try:
            url = f"{base}/v2/models/medium_image/infer"
            wrk, probe_wrk = wrks
            wrk.run(url, bodies["batch"], args.clients, 2)  # warm-up
            # busy is the compute the window's batches took over the window: it starts once the
            # warm-up's last batches are done (counted in it, they made busy read 110 %) and ends
            # once the load's are, so every batch counted ran inside it, on the one compute stream
            before, _ = settled_stats(base)
            t0 = time.monotonic()
            probing = background.submit(probe_wrk.run, f"{base}/v2/models/digits/infer", bodies["digits"], 1,
                                        args.seconds)
            load = wrk.run(url, bodies["batch"], args.clients, args.seconds)
            after, t_end = settled_stats(base)
            wall = t_end - t0
            probe = probing.result()
            one = wrk.run(url, bodies["single"], 1, args.latency_seconds)
            batch = wrk.run(url, bodies["batch"], 1, args.latency_seconds)
        finally:  # a dead server is the failure to name, whatever wrk or its statistics made of it
            ensure_running(server, mode)
    runs = after["runs"] - before["runs"]
    errors = sum(r["socket_errors"] + r["errors"]["status"] for r in (load, probe, one, batch))
    return {"workers": workers, "images_s": load["rps"] * args.images_per_request,
            "busy": (after["infer_ns"] - before["infer_ns"]) / 1e9 / wall,
            "mean_batch": (after["rows"] - before["rows"]) / runs if runs else 0.0,
            "p50_ms": one["latency_us"]["p50"] / 1e3, "p99_ms": one["latency_us"]["p99"] / 1e3,
            "probe_p50_ms": probe["latency_us"]["p50"] / 1e3, "batch_p50_ms": batch["latency_us"]["p50"] / 1e3,
            "errors": errors}


def median_row(rounds: list[dict]) -> dict:
    return {k: (float(np.median([r[k] for r in rounds])) if k != "errors" else sum(r[k] for r in rounds))
            for k in rounds[0]}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=whole_seconds, default=10,
                        help="throughput window per mode (default 10; whole seconds, as wrk takes them: a fraction "
                             "is rounded up)")
    parser.add_argument("--latency-seconds", type=whole_seconds, default=5,
                        help="one-client window (default 5; a fraction is rounded up)")
    parser.add_argument("--clients", type=positive_int, default=16, help="connections for throughput (default 16)")
    parser.add_argument("--images-per-request", type=positive_int, default=4,
                        help="JPEGs in each request of the throughput window (default %(default)s)")
    parser.add_argument("--workers", type=positive_int, default=2, help="decode threads of the pool mode (default 2)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds per mode (default 3)")
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "out", "models"),
                        help="where medium.onnx is (built there if missing; default out/models)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("bench_images", lambda: run(args))


def run(args) -> int:
    require_wrk()  # (before the model is built and a server started)
    pictures = photos()
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        os.makedirs(os.path.join(tmp, "repo"))
        onnx_path = build_repository(os.path.join(tmp, "repo"), args.models_dir)
        decode_ms, compute_ms = unit_costs(onnx_path, pictures)
        bodies = {"batch": bytes_body([pictures[i % 2] for i in range(args.images_per_request)]),
                  "single": bytes_body(pictures[:1]), "digits": digits_body()}
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        wrks = (Wrk(cpus), Wrk(cpus))
        runs: dict[int, list[dict]] = {args.workers: [], 0: []}
        try:
            for _ in range(args.rounds):  # alternate, so a change in background load hits both modes
                for workers in runs:
                    runs[workers].append(run_mode(workers, args, tmp, wrks, bodies))
        finally:
            for w in wrks:
                w.close()
    return report(args, runs, decode_ms, compute_ms)


def report(args, runs: dict[int, list[dict]], decode_ms: float, compute_ms: float) -> int:
    """Print the run's figures; its exit status: 1 when a request failed (the errors column), as
    bench_server.py and bench_overload.py end (it exited 0 whatever that column said)."""
    jpegs = f"{args.images_per_request} JPEG{'s' if args.images_per_request > 1 else ''}"
    print(f"{os.cpu_count()} CPUs; one decode + centre crop of a 640x427 JPEG to 64x64: {decode_ms:.2f} ms "
          f"(one thread); medium CNN compute: {compute_ms:.2f} ms per image at batch 4")
    print(f"throughput: {args.clients} connections x {jpegs} per request, {args.seconds:g} s; latency: "
          f"1 connection, 1 JPEG and {jpegs} per request, {args.latency_seconds:g} s each")
    rows = [median_row(r) for r in runs.values()]
    print(f"medians of {args.rounds} alternating rounds; images/s per round: "
          + "; ".join(f"{'pool' if w else 'inline'} " + ", ".join(f"{r['images_s']:,.0f}" for r in rs)
                      for w, rs in runs.items()))
    print("| decoding | images/s | device busy | mean batch | digits p50 ms meanwhile | 1 client, 1 JPEG: p50 / p99 ms "
          f"| 1 client, {jpegs}: p50 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mode = f"pool, {r['workers']:.0f} threads" if r["workers"] else "inline (event loop)"
        print(f"| {mode} | {r['images_s']:,.0f} | {r['busy']:.0%} | {r['mean_batch']:.1f} | {r['probe_p50_ms']:.2f} "
              f"| {r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['batch_p50_ms']:.2f} | {r['errors']} |")
    pool, inline = rows
    print(f"pool / inline: {pool['images_s'] / inline['images_s']:.2f}x images/s")
    errors = sum(r["errors"] for r in rows)
    if errors:
        print(f"\nFAIL: {errors} request errors (see the errors column)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
