#!/usr/bin/env python3
"""Server benchmark: closed-loop wrk load against `aclserve serve`, compared with raw ONNX Runtime.

What one run does (defaults: about 5.5 minutes):
  1. builds out/models/{light,medium}.onnx if missing (tools/make_example_models.py), compiles
     them to CPU OMs in a temp repository, starts `aclserve serve` pinned with taskset to the
     server core(s), ORT on --threads threads, and waits for /v2/health/ready;
  2. posts one sample per model and format and checks the output against ONNX Runtime on the
     source ONNX (fails above 1e-4);
  3. for each workload (light/medium x KServe v2 JSON/binary over HTTP, and gRPC) and each
     concurrency: a warm-up (discarded), then the measured window, pinned to the client core,
     with /v2/models/{m}/stats and the server's CPU time (utime + stime of every thread, from
     /proc/<pid>/stat) read just before and after it: CPU us/req = CPU time / successful
     requests. HTTP load comes from wrk -t1; gRPC
     load from perf_analyzer (Triton's C++ client, -i grpc; --perf-analyzer PATH, on PATH, or
     out/perf-analyzer/ as tools/install_perf_analyzer.py installs it),
     since wrk speaks no HTTP/2 and a Python client would measure itself;
  4. stops the server (SIGTERM, wait), then times raw InferenceSession.run (same threads, this
     process pinned to the server core) at every batch size the server executed: raw@mix =
     samples / raw time of the executed batch mix (stats delta of the window), eff = req/s / raw@mix;
  5. measures two fixed-answer endpoints on the server core with the same wrk settings and
     bodies (uvloop if present): a trivial asyncio protocol (wrk's own ceiling) and a bare
     aiohttp app that reads the body and answers (the floor of any aiohttp front end: what
     aclserve could at best reach in req/s, p50 and CPU per request, were its own work free);
  6. prints Markdown tables (and --json FILE). Exit status 1 on any request error or a wrong
     output; a server that died during a window ends the run in one error line, no table; 130
     when interrupted (Ctrl-C, SIGTERM: the server stopped, the temp folders removed).

    python tools/bench_server.py [--duration 10] [--warmup 2] [--conc 1,16,64]
        [--workloads light-json,light-binary,medium-json,medium-binary,medium-grpc] [--json FILE]
        [--perf-analyzer PATH]

Errors per window = wrk socket errors (connect/read/write/timeout) + bad answers, the largest of:
wrk status errors (>= 400), and answers the server did not count as successful inferences (wrk
requests minus the stats' success delta, when positive; catches any other non-2xx). --count-non2xx adds an exact
per-response status check in wrk's Lua, which lowers wrk's own ceiling about 3x.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_args import (cpu_list, non_negative_float, positive_float, positive_int, positive_ints,  # noqa: E402
                        whole_seconds, whole_seconds_or_none)
from bench_bodies import HEADER_LENGTH, binary_body, decode_output, json_body, sample_for  # noqa: E402
from bench_common import ManagedProcess, cpu_seconds, cpu_set, free_port, http, wait_ready  # noqa: E402
from bench_grpc import PerfAnalyzer, find_perf_analyzer, infer_grpc  # noqa: E402
from bench_models import RawOrt, ensure_example_models  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_tool, stop_server  # noqa: E402
from bench_server_report import CEILING_ENDPOINTS, print_header, print_tables  # noqa: E402
from bench_wrk import Body, Wrk, require_wrk  # noqa: E402

WORKLOADS = {"light-json": ("light", "json"), "light-binary": ("light", "binary"),
             "medium-json": ("medium", "json"), "medium-binary": ("medium", "binary"),
             "light-grpc": ("light", "grpc"), "medium-grpc": ("medium", "grpc")}
DEFAULT_WORKLOADS = "light-json,light-binary,medium-json,medium-binary,medium-grpc"
TOLERANCE = 1e-4


def prepare_repository(src: str, repo: str, only: tuple[str, ...] | None = None) -> dict[str, str]:
    """Build the example ONNX models if missing, compile them (or those named in `only`) into
    `repo`; name -> onnx path."""
    paths = ensure_example_models(src)
    if only is not None:
        paths = {name: path for name, path in paths.items() if name in only}
    for name, path in paths.items():
        subprocess.run([sys.executable, "-m", "aclserve", "compile", path, "-o", os.path.join(repo, f"{name}.om"),
                        "--target", "cpu"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return paths


def model_stats(base: str, model: str) -> dict:
    return json.loads(http(f"{base}/v2/models/{model}/stats"))["model_stats"][0]


def batch_mix(before: dict, after: dict) -> dict[int, int]:
    """Executions per executed batch size (real rows) between two stats snapshots."""
    def counts(stats):
        return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    b0, b1 = counts(before), counts(after)
    return {size: n - b0.get(size, 0) for size, n in sorted(b1.items()) if n - b0.get(size, 0) > 0}


def make_bodies(raw: RawOrt) -> dict[str, tuple[np.ndarray, Body]]:
    sample = sample_for(raw.sample_shape)
    data, head_len = binary_body(sample, raw.input.name, raw.output_name)
    return {"json": (sample, Body(json_body(sample, raw.input.name), "application/json")),
            "binary": (sample, Body(data, "application/octet-stream", f"{HEADER_LENGTH}: {head_len}"))}


def check_output(base: str, model: str, raw: RawOrt, fmt: str, sample: np.ndarray, body: Body | str) -> float:
    """Max abs difference from ONNX Runtime of one answer; `body` is the gRPC address for fmt grpc."""
    if fmt == "grpc":
        got = infer_grpc(body, model, raw.input.name, raw.output_name, sample)
    else:
        headers = {"Content-Type": body.content_type}
        if body.extra_header:
            k, _, v = body.extra_header.partition(": ")
            headers[k] = v
        got = decode_output(http(f"{base}/v2/models/{model}/infer", body.data, headers), raw.output_name)
    want = raw.infer(sample)
    if got.shape != want.shape:
        raise BenchFailed(f"{model} {fmt}: output shape {list(got.shape)}, ONNX Runtime gives {list(want.shape)}")
    return float(np.max(np.abs(got - want)))


def run_window(wrk: Wrk, base: str, model: str, body: Body, conc: int, args, server: ManagedProcess,
               label: str) -> dict:
    url = f"{base}/v2/models/{model}/infer"
    if args.warmup > 0:
        wrk.run(url, body, conc, args.warmup)
    return measured(base, model, lambda: wrk.run(url, body, conc, args.duration), True, server, label)


def run_grpc_window(pa: PerfAnalyzer, address: str, base: str, model: str, conc: int, args, server: ManagedProcess,
                    label: str) -> dict:
    if args.warmup > 0:
        pa.run(address, model, conc, args.warmup)
    return measured(base, model, lambda: pa.run(address, model, conc, args.duration), False, server, label)


def measured(base: str, model: str, load, exact_count: bool, server: ManagedProcess, label: str) -> dict:
    """Run `load()` between two stats snapshots and two readings of the server's CPU time.
    perf_analyzer reports a rate, not a request count (and fails on any failed request), so
    only wrk's count is matched to the successes."""
    pid = server.proc.pid
    before = model_stats(base, model)
    cpu_before = cpu_seconds(pid)
    try:
        result = load()
    finally:  # a dead server named as such (its stats call failed "Connection refused", naming nothing)
        ensure_running(server, label)
    time.sleep(0.2)  # let batches in flight at the window's end be counted
    cpu = cpu_seconds(pid) - cpu_before
    after = model_stats(base, model)
    ok = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    failed = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    unaccounted = max(0, result["requests"] - ok) if exact_count else failed
    # three views of the bad answers (they overlap): >= 400, non-2xx if counted, not a success
    bad_answers = max(result["errors"]["status"], result["non2xx"], unaccounted)
    errors = result["socket_errors"] + bad_answers
    return {"wrk": result, "mix": batch_mix(before, after), "server_ok": ok, "server_fail": failed,
            "unaccounted": unaccounted, "errors": errors, "cpu_s": cpu,
            "cpu_us_per_req": cpu / ok * 1e6 if ok else 0.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=whole_seconds, default=10,
                   help="measured seconds per window (default 10; whole seconds, as wrk takes them: a fraction "
                        "is rounded up)")
    p.add_argument("--warmup", type=whole_seconds_or_none, default=2,
                   help="discarded warm-up seconds per window (default 2; 0 for none; a fraction is rounded up)")
    p.add_argument("--conc", type=positive_ints, default="1,16,64",
                   help="wrk connections, comma-separated (default 1,16,64)")
    p.add_argument("--workloads", help=f"subset of {','.join(WORKLOADS)} (default {DEFAULT_WORKLOADS}; "
                                        "the gRPC one only when perf_analyzer is found)")
    p.add_argument("--perf-analyzer", metavar="PATH",
                   help="perf_analyzer for the gRPC rows (default: on PATH, else out/perf-analyzer/)")
    p.add_argument("--server-cpus", type=cpu_list, default="1", help="taskset list for the server (default 1)")
    p.add_argument("--client-cpus", type=cpu_list, default="0", help="taskset list for wrk (default 0)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="ORT intra-op threads, server and raw (default 1)")
    p.add_argument("--max-batch", type=positive_int, help="server --max-batch (default: the server's)")
    p.add_argument("--max-delay-ms", type=non_negative_float, help="server --max-delay-ms (default: the server's)")
    p.add_argument("--models-src", default=os.path.join(ROOT, "out", "models"),
                   help="where light.onnx/medium.onnx are (built there if missing; default out/models)")
    p.add_argument("--ceiling-bodies", default="light-json,medium-binary",
                   help="workload bodies posted to the fixed-answer endpoints ('' to skip; "
                        "default light-json,medium-binary)")
    p.add_argument("--count-non2xx", action="store_true", help="exact non-2xx count in wrk (lowers its ceiling)")
    p.add_argument("--start-timeout", type=positive_float, default=120,
                   help="seconds to wait for readiness (default %(default)g)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    explicit = args.workloads is not None
    args.workloads = [w for w in (args.workloads or DEFAULT_WORKLOADS).split(",") if w]
    args.ceiling_bodies = [w for w in args.ceiling_bodies.split(",") if w]
    for w in args.workloads + args.ceiling_bodies:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r} (choose from {', '.join(WORKLOADS)})")
    if any(WORKLOADS[w][1] == "grpc" for w in args.ceiling_bodies):
        p.error("--ceiling-bodies: the fixed-answer endpoints speak HTTP only")
    args.perf_analyzer_path = None
    if any(WORKLOADS[w][1] == "grpc" for w in args.workloads):
        args.perf_analyzer_path = find_perf_analyzer(args.perf_analyzer)
        if args.perf_analyzer_path is None and explicit:
            p.error("gRPC workloads need perf_analyzer: put it on PATH or pass --perf-analyzer PATH "
                    "(or leave the -grpc workloads out)")
        if args.perf_analyzer_path is None:
            print("no perf_analyzer (PATH, --perf-analyzer or python tools/install_perf_analyzer.py): "
                  "the gRPC rows are left out", file=sys.stderr)
            args.workloads = [w for w in args.workloads if WORKLOADS[w][1] != "grpc"]
    return args


def measure_endpoint(endpoint: str, args, bodies: dict, wrk: Wrk, tmp: str, closers: list) -> list[dict]:
    """wrk against one fixed-answer endpoint (bench_endpoints.py `endpoint`) on the server core,
    with each --ceiling-bodies body at each concurrency; its CPU per request from /proc."""
    server = ManagedProcess(["taskset", "-c", args.server_cpus, sys.executable,
                             os.path.join(TOOLS, "bench_endpoints.py"), endpoint],
                            os.path.join(tmp, f"{endpoint}.log"), stdout=subprocess.PIPE)
    closers.append(server)
    port_line = server.proc.stdout.readline()
    if not port_line.strip():
        raise BenchFailed(f"{endpoint} did not start:\n{server.log_tail()}")
    url = f"http://127.0.0.1:{int(port_line)}/v2/models/trivial/infer"
    results = []
    for w in args.ceiling_bodies:
        m, fmt = WORKLOADS[w]
        body = bodies[m][fmt][1]
        for conc in args.conc:
            if args.warmup > 0:
                wrk.run(url, body, conc, args.warmup)
            cpu0 = cpu_seconds(server.proc.pid)
            try:
                res = wrk.run(url, body, conc, args.duration)
            finally:
                ensure_running(server, f"{endpoint} {w} c={conc}")
            cpu = cpu_seconds(server.proc.pid) - cpu0
            errors = res["socket_errors"] + max(res["errors"]["status"], res["non2xx"])
            results.append({"endpoint": endpoint, "body": w, "bytes": len(body.data), "conc": conc, "wrk": res,
                            "errors": errors, "cpu_us_per_req": cpu / res["requests"] * 1e6 if res["requests"] else 0.0})
    server.close()
    return results


def bench(args, tmp: str, closers: list) -> dict:
    repo = os.path.join(tmp, "repo")
    os.makedirs(repo)
    onnx_paths = prepare_repository(args.models_src, repo)
    models = sorted({WORKLOADS[w][0] for w in args.workloads + args.ceiling_bodies})
    raws = {m: RawOrt(onnx_paths[m], args.threads, cpu_set(args.server_cpus)) for m in models}
    bodies = {m: make_bodies(raws[m]) for m in models}
    wrk = Wrk(args.client_cpus, count_non2xx=args.count_non2xx)
    closers.append(wrk)
    pa = None
    if args.perf_analyzer_path:
        pa = PerfAnalyzer(args.perf_analyzer_path, args.client_cpus)
        closers.append(pa)

    port, grpc_port = free_port(), free_port()
    base, grpc_address = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "aclserve", "serve", "--models", repo,
           "--port", str(port), "--grpc-port", str(grpc_port), "--model-control-mode", "none",
           "--log-level", "warning",
           "--cpu-threads", str(args.threads)]
    if args.max_batch is not None:
        cmd += ["--max-batch", str(args.max_batch)]
    if args.max_delay_ms is not None:
        cmd += ["--max-delay-ms", str(args.max_delay_ms)]
    server = ManagedProcess(cmd, os.path.join(tmp, "server.log"), cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    closers.append(server)
    wait_ready(server, base, args.start_timeout)
    cfg = {m: json.loads(http(f"{base}/v2/models/{m}/config")) for m in models}
    print_header(args, cfg, pa)

    checks, failed = [], False
    for m in models:
        targets = dict(bodies[m], **({"grpc": (bodies[m]["binary"][0], grpc_address)} if pa else {}))
        for fmt, (sample, body) in targets.items():
            diff = check_output(base, m, raws[m], fmt, sample, body)
            checks.append({"model": m, "format": fmt, "max_abs_diff": diff})
            failed |= not diff <= TOLERANCE
            print(f"check {m} {fmt}: max abs diff vs ONNX Runtime {diff:.2e}"
                  f"{'' if diff <= TOLERANCE else f'  FAIL (> {TOLERANCE:g})'}")
    if failed:
        raise BenchFailed("server outputs differ from ONNX Runtime")

    rows = []
    for w in args.workloads:
        m, fmt = WORKLOADS[w]
        for conc in args.conc:
            if fmt == "grpc":
                r = run_grpc_window(pa, grpc_address, base, m, conc, args, server, f"{w} c={conc}")
            else:
                r = run_window(wrk, base, m, bodies[m][fmt][1], conc, args, server, f"{w} c={conc}")
            r.update(model=m, format=fmt, conc=conc)
            rows.append(r)
            print(f"  {w} c={conc}: {r['wrk']['rps']:.0f} req/s, {r['cpu_us_per_req']:.0f} us CPU/req, "
                  f"errors {r['errors']}", file=sys.stderr, flush=True)
    stop_server(server, "bench_server")

    for r in rows:  # the server is stopped: raw ORT has the core to itself
        mix = r["mix"]
        execs = sum(mix.values())
        r["mean_batch"] = sum(b * n for b, n in mix.items()) / execs if execs else 0.0
        r["raw_at_mix"] = raws[r["model"]].samples_per_s_at_mix(mix)
        r["eff"] = r["wrk"]["rps"] / r["raw_at_mix"] if r["raw_at_mix"] else 0.0

    ceiling = []
    for endpoint in (CEILING_ENDPOINTS if args.ceiling_bodies else ()):
        ceiling += measure_endpoint(endpoint, args, bodies, wrk, tmp, closers)

    print()
    print_tables(rows, ceiling)
    return {"nproc": os.cpu_count(), "server_cpus": args.server_cpus, "client_cpus": args.client_cpus,
            "threads": args.threads, "duration_s": args.duration, "warmup_s": args.warmup,
            "model_config": cfg, "checks": checks,
            "rows": [{k: v for k, v in r.items()} | {"mix": {str(b): n for b, n in r["mix"].items()}} for r in rows],
            "ceiling": ceiling}


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # keep stdout and stderr progress in order
    return run_tool("bench_server", lambda: run(args))


def run(args) -> int:
    if any(WORKLOADS[w][1] != "grpc" for w in args.workloads) or args.ceiling_bodies:
        require_wrk()  # (before the models are built; the gRPC rows' load is perf_analyzer's)
    closers: list = []
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        try:
            report = bench(args, tmp, closers)
        finally:
            for c in reversed(closers):  # server and trivial endpoint first, then wrk's folder
                c.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    bad = sum(r["errors"] for r in report["rows"]) + sum(c["errors"] for c in report["ceiling"])
    if bad:
        print(f"\nFAIL: {bad} request errors (see the errors columns)", file=sys.stderr)
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
