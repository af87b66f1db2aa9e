"""The printed report of tools/bench_server.py: the run's settings, the server rows and the
fixed-answer endpoints' rows as Markdown tables."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess

from bench_grpc import PerfAnalyzer

# the fixed-answer endpoints bench_server measures (bench_endpoints.py serves them)
CEILING_ENDPOINTS = {
    "trivial-server": "trivial asyncio endpoint (wrk's ceiling)",
    "aiohttp-floor": "bare aiohttp app (the HTTP front end's floor)",
}


def ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def print_header(args, cfg: dict, pa: PerfAnalyzer | None) -> None:
    import onnxruntime as ort
    # (none in a run of gRPC rows alone, whose load is perf_analyzer's)
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split(" Copyright")[0] \
        if shutil.which("wrk") else "no wrk"
    dyn = {m: c.get("dynamic_batching", {}) for m, c in cfg.items()}
    print("# aclserve server benchmark")
    print(f"- machine: {platform.node()}, nproc={os.cpu_count()}, {cpu_model()}, "
          f"Python {platform.python_version()}, onnxruntime {ort.__version__}, {wrk_version.strip()}")
    print(f"- pinning: server `taskset -c {args.server_cpus}` (also the trivial endpoint and raw ORT), "
          f"wrk -t1 `taskset -c {args.client_cpus}`; ORT intra-op threads {args.threads} (server and raw)")
    if pa is not None:
        print(f"- gRPC rows: load from {pa.version()} (`-i grpc`, C++ client, closed loop, random data), "
              f"`taskset -c {args.client_cpus}`; HTTP rows: wrk")
    for m, c in cfg.items():
        print(f"- {m}: max_batch_size {c.get('max_batch_size')}, gears {dyn[m].get('preferred_batch_size')}, "
              f"max_queue_delay {dyn[m].get('max_queue_delay_microseconds', 0) / 1000:g} ms")
    print(f"- windows: {args.duration:g} s measured after {args.warmup:g} s warm-up (discarded), "
          f"concurrency {','.join(map(str, args.conc))}; one sample per request; the machine may be shared "
          f"(noisy figures)\n")


# an eff past this says the raw timing was disturbed, not that the server beat it (print_tables)
EFF_PAST_RAW = 1.02


def print_tables(rows: list[dict], ceiling: list[dict]) -> None:
    print("| model | format | conc | req/s | p50 ms | p90 ms | p99 ms | errors | mean batch | raw@mix/s | eff "
          "| CPU us/req |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lat = r["wrk"]["latency_us"]
        print(f"| {r['model']} | {r['format']} | {r['conc']} | {r['wrk']['rps']:.0f} | {ms(lat['p50'])} | "
              f"{ms(lat['p90'])} | {ms(lat['p99'])} | {r['errors']} | {r['mean_batch']:.2f} | "
              f"{r['raw_at_mix']:.0f} | {r['eff']:.2f} | {r['cpu_us_per_req']:.0f} |")
    disturbed = [f"{r['model']} {r['format']} c={r['conc']}" for r in rows if r["eff"] > EFF_PAST_RAW]
    if disturbed:  # (a tester saw 1.17 on a shared machine, the raw timing at 860 against 1,495 alone)
        print(f"- eff over {EFF_PAST_RAW:g} ({', '.join(disturbed)}): the server cannot beat raw ONNX Runtime "
              "on its own core, so other work slowed the raw timing of that mix; rerun on a quiet machine")
    if ceiling:
        print("\nFixed-answer endpoints on the server core (same wrk settings and bodies): "
              + "; ".join(f"{name}: {what}" for name, what in CEILING_ENDPOINTS.items()) + ":\n")
        print("| endpoint | body | bytes | conc | req/s | p50 ms | p99 ms | errors | CPU us/req |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for c in ceiling:
            lat = c["wrk"]["latency_us"]
            print(f"| {c['endpoint']} | {c['body']} | {c['bytes']} | {c['conc']} | {c['wrk']['rps']:.0f} | "
                  f"{ms(lat['p50'])} | {ms(lat['p99'])} | {c['errors']} | {c['cpu_us_per_req']:.0f} |")
        for conc in sorted({r["conc"] for r in rows}):
            served = max((r["wrk"]["rps"] for r in rows if r["conc"] == conc), default=0)
            ceil = min((c["wrk"]["rps"] for c in ceiling if c["conc"] == conc and c["endpoint"] == "trivial-server"),
                       default=0)
            if served and ceil:
                note = "" if ceil >= 2 * served else "  (under 2x: wrk may limit, or the machine was busy; rerun)"
                print(f"- conc {conc}: lowest wrk ceiling {ceil:.0f} req/s = {ceil / served:.1f}x the fastest "
                      f"server row ({served:.0f} req/s){note}")
        for r in rows:
            floor = next((c for c in ceiling if c["endpoint"] == "aiohttp-floor" and c["conc"] == r["conc"]
                          and c["body"] == f"{r['model']}-{r['format']}"), None)
            if floor is not None and r["wrk"]["rps"]:
                print(f"- {r['model']} {r['format']} c={r['conc']}: {r['wrk']['rps'] / floor['wrk']['rps']:.2f} x "
                      f"the bare aiohttp app's req/s, p50 {ms(r['wrk']['latency_us']['p50'])} against "
                      f"{ms(floor['wrk']['latency_us']['p50'])} ms, CPU {r['cpu_us_per_req']:.0f} against "
                      f"{floor['cpu_us_per_req']:.0f} us/req")
    print("\nraw@mix = samples / time of raw InferenceSession.run for the executed batch-size mix (median "
          "per size, same threads and core); eff = req/s / raw@mix; CPU us/req = the server process's "
          "user + system CPU time over the window (all threads, /proc/<pid>/stat) / successful requests.")
    if any(r["format"] == "grpc" for r in rows):
        print("Load generators: wrk for the json/binary rows (HTTP/1.1), perf_analyzer -i grpc for the grpc "
              "rows (a wrk ceiling, when measured, is an HTTP figure).")
