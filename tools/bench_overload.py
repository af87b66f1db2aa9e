#!/usr/bin/env python3
"""Overload benchmark: how much of its capacity a model keeps when far more clients hammer it
than it can serve, with and without holding refused connections (hold_refused_connections).

What one run does (defaults: about 2 minutes):
  1. builds out/models/medium.onnx if missing (tools/make_example_models.py), compiles it to a
     CPU OM in a temp repository and, for each setting (holds on: the default; holds off),
     starts `aclserve serve` pinned with taskset to the server core, ORT on one thread;
  2. capacity: wrk closed loop at --capacity-conc connections (binary bodies), all answers 200;
  3. overload: wrk closed loop at each of --conc connections. wrk ignores Retry-After, so
     every refused client retries at once: the worst case for the server. Each answer's status
     is counted in wrk's Lua; 200/s is compared with the same server's capacity, and the
     server's CPU time (all threads, /proc) is divided by the 200s;
  4. prints a Markdown table (and --json FILE).

    python tools/bench_overload.py [--conc 256,1000] [--duration 10] [--json FILE]

Default model config: each priority level queues at most 8 x the largest gear (auto), so the
medium CNN (gears up to 32) refuses past 256 queued requests.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_common import ManagedProcess, RawOrt, Wrk, cpu_seconds, cpu_set, free_port, wait_ready  # noqa: E402
from bench_server import make_bodies, prepare_repository  # noqa: E402

SETTINGS = {"holds on": True, "holds off": False}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conc", default="256,1000", help="overload connections, comma-separated")
    p.add_argument("--capacity-conc", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--models-src", default=os.path.join(ROOT, "out", "models"))
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    args.conc = [int(c) for c in args.conc.split(",")]
    return args


def window(wrk: Wrk, url: str, body, conc: int, seconds: float, pid: int) -> dict:
    cpu0 = cpu_seconds(pid)
    r = wrk.run(url, body, conc, seconds)
    cpu = cpu_seconds(pid) - cpu0
    elapsed = r["duration_us"] / 1e6
    ok = r["requests"] - r["non2xx"]
    return {"conc": conc, "ok_per_s": ok / elapsed, "refused_per_s": r["non2xx"] / elapsed,
            "socket_errors": r["socket_errors"], "cpu_us_per_ok": cpu / ok * 1e6 if ok else 0.0,
            "latency_p50_ms": r["latency_us"]["p50"] / 1000}


def run_setting(name: str, hold: bool, args, repo: str, body, wrk: Wrk, tmp: str, closers: list) -> list[dict]:
    config = os.path.join(tmp, f"{name.replace(' ', '-')}.yaml")
    with open(config, "w") as f:
        f.write(f"hold_refused_connections: {'true' if hold else 'false'}\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = ManagedProcess(["taskset", "-c", args.server_cpus, sys.executable, "-m", "aclserve", "serve",
                             "--config", config, "--models", repo, "--port", str(port), "--grpc-port", "0",
                             "--model-control-mode", "none", "--log-level", "warning", "--cpu-threads", "1"],
                            os.path.join(tmp, f"server-{port}.log"), cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    closers.append(server)
    wait_ready(server, base, args.start_timeout)
    url, pid = f"{base}/v2/models/medium/infer", server.proc.pid
    rows = []
    for conc in [args.capacity_conc, *args.conc]:
        if args.warmup > 0:
            wrk.run(url, body, conc, args.warmup)
        row = window(wrk, url, body, conc, args.duration, pid)
        row["setting"] = name
        rows.append(row)
        print(f"  {name} c={conc}: {row['ok_per_s']:.0f} x 200/s, {row['refused_per_s']:.0f} refused/s",
              file=sys.stderr, flush=True)
    server.close()
    capacity = rows[0]["ok_per_s"]
    for row in rows:
        row["share_of_capacity"] = row["ok_per_s"] / capacity if capacity else 0.0
    return rows


def print_table(rows: list[dict]) -> None:
    print("| setting | connections | 200/s | share of capacity | refused (503)/s | server CPU us per 200 "
          "| p50 of all answers ms | socket errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['conc']} | {r['ok_per_s']:,.0f} | {r['share_of_capacity']:.2f} | "
              f"{r['refused_per_s']:,.0f} | {r['cpu_us_per_ok']:.0f} | {r['latency_p50_ms']:.1f} | {r['socket_errors']} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    closers: list = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
            repo = os.path.join(tmp, "repo")
            os.makedirs(repo)
            onnx = prepare_repository(args.models_src, repo, only=("medium",))
            body = make_bodies(RawOrt(onnx["medium"], 1, cpu_set(args.server_cpus)))["binary"][1]
            wrk = Wrk(args.client_cpus, count_non2xx=True)
            closers.append(wrk)
            print(f"medium CNN, binary bodies, server on CPU {args.server_cpus}, wrk -t1 on CPU {args.client_cpus}, "
                  f"{args.duration:g} s windows; capacity = {args.capacity_conc} connections\n")
            rows = []
            for name, hold in SETTINGS.items():
                rows += run_setting(name, hold, args, repo, body, wrk, tmp, closers)
            print_table(rows)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, f, indent=1)
    finally:
        for c in reversed(closers):
            c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
