#!/usr/bin/env python3
"""Overload benchmark: how much of its capacity a model keeps when far more clients hammer it
than it can serve, with the default config and with each overload guard changed alone
(hold_refused_connections on, shed_before_parsing off).

What one run does (defaults: about 5 minutes):
  1. builds out/models/medium.onnx if missing (tools/make_example_models.py), compiles it to a
     CPU OM in a temp repository and, for each setting (SETTINGS),
     starts `aclserve serve` pinned with taskset to the server core, ORT on one thread;
  2. capacity: wrk closed loop at --capacity-conc connections (binary bodies, or JSON with
     --body json), all answers 200;
  3. overload, closed loop: wrk at each of --conc connections. wrk ignores Retry-After, so
     every refused client retries at once: the worst case for the server. Each answer's status
     is counted in wrk's Lua; 200/s is compared with the same server's capacity, and the
     server's CPU time (all threads, /proc) is divided by the 200s;
  4. overload, open loop: tools/open_loop.py on the client core sends Poisson arrivals at each
     of --open-loads x that capacity, each on an idle keep-alive connection or a new one (at
     most 4,000), giving up on an answer after --client-timeout s (the issue's reproduction:
     open loop at 2x and 4x, clients with a 1 s timeout);
  5. prints Markdown tables (and --json FILE). Exit status 1 on wrk socket errors; a server
     that died during a window, or an open-loop window without a 200, ends the run in one error
     line, no table; 130 when interrupted (Ctrl-C, SIGTERM: servers stopped, folders removed).

    python tools/bench_overload.py [--conc 256,1000] [--open-loads 2,4] [--duration 10] [--json FILE]

Default model config: each priority level queues at most 8 x the largest gear (auto), so the
medium CNN (gears up to 32) refuses past 256 queued requests.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_args import (cpu_list, positive_float, positive_floats_or_none, positive_int,  # noqa: E402
                        positive_ints_or_none, whole_seconds, whole_seconds_or_none)
from bench_common import ManagedProcess, cpu_seconds, cpu_set, free_port, wait_ready  # noqa: E402
from bench_models import RawOrt  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_tool, stop_server  # noqa: E402
from bench_server import make_bodies, prepare_repository  # noqa: E402
from bench_wrk import Wrk, require_wrk  # noqa: E402

# name -> server config: the default, then each overload guard changed alone
SETTINGS = {"default": "",
            "holds on": "hold_refused_connections: true\n",
            "no early refusals": "shed_before_parsing: false\n"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " A default run takes about 5 minutes.")
    p.add_argument("--conc", type=positive_ints_or_none, default="256,1000",
                   help="closed-loop overload connections, comma-separated ('' for none: capacity only; "
                        "default %(default)s)")
    p.add_argument("--open-loads", type=positive_floats_or_none, default="2,4",
                   help="open-loop rates as multiples of capacity ('' to skip; default %(default)s)")
    p.add_argument("--client-timeout", type=positive_float, default=1.0,
                   help="open loop: seconds a client waits (default %(default)g)")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"subset of {','.join(SETTINGS)} (default all)")
    p.add_argument("--body", choices=("binary", "json"), default="binary",
                   help="the requests' body: binary tensor extension (49 KB) or KServe v2 JSON (72 KB); "
                        "default %(default)s")
    p.add_argument("--capacity-conc", type=positive_int, default=64,
                   help="connections of the capacity window (default %(default)s)")
    p.add_argument("--duration", type=whole_seconds, default=10,
                   help="seconds per window (default %(default)s; whole seconds, as wrk takes them: a fraction is "
                        "rounded up)")
    p.add_argument("--warmup", type=whole_seconds_or_none, default=2,
                   help="discarded seconds before each window (default %(default)s; 0 for none; a fraction is "
                        "rounded up)")
    p.add_argument("--server-cpus", type=cpu_list, default="0",
                   help="taskset list for the server (default %(default)s)")
    p.add_argument("--client-cpus", type=cpu_list, default="1",
                   help="taskset list for wrk and open_loop.py (default %(default)s)")
    p.add_argument("--models-src", default=os.path.join(ROOT, "out", "models"),
                   help="where medium.onnx is (built there if missing; default out/models)")
    p.add_argument("--start-timeout", type=positive_float, default=180.0,
                   help="seconds to wait for each server's readiness (default %(default)g)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    args.settings = [x for x in args.settings.split(",") if x]
    for name in args.settings:
        if name not in SETTINGS:
            p.error(f"unknown setting {name!r} (choose from {', '.join(SETTINGS)})")
    return args


def window(wrk: Wrk, url: str, body, conc: int, seconds: float, server: ManagedProcess, label: str) -> dict:
    pid = server.proc.pid
    cpu0 = cpu_seconds(pid)
    try:
        r = wrk.run(url, body, conc, seconds)
    finally:  # a dead server is the failure to name, whatever wrk made of it
        ensure_running(server, label)
    cpu = cpu_seconds(pid) - cpu0
    elapsed = r["duration_us"] / 1e6
    ok = r["requests"] - r["non2xx"]
    return {"conc": conc, "ok_per_s": ok / elapsed, "refused_per_s": r["non2xx"] / elapsed,
            "socket_errors": r["socket_errors"], "cpu_us_per_ok": cpu / ok * 1e6 if ok else 0.0,
            "latency_p50_ms": r["latency_us"]["p50"] / 1000}


def open_window(args, url: str, body_path: str, body, rate: float, server: ManagedProcess, label: str) -> dict:
    """One open-loop window of tools/open_loop.py on the client core, with the server's CPU."""
    pid = server.proc.pid
    cmd = ["taskset", "-c", args.client_cpus, sys.executable, os.path.join(TOOLS, "open_loop.py"), url, body_path,
           "--rate", str(rate), "--seconds", str(args.duration), "--warmup", str(args.warmup),
           "--timeout", str(args.client_timeout), "--content-type", body.content_type]
    if body.extra_header:
        cmd += ["--header", body.extra_header]
    cpu0 = cpu_seconds(pid)
    done = subprocess.run(cmd, capture_output=True, text=True)
    ensure_running(server, label)
    cpu = cpu_seconds(pid) - cpu0
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "nothing").splitlines()[-1]
        raise BenchFailed(f"open_loop.py failed in {label} (exit status {done.returncode}): {said}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ok = result["ok_per_s"] * args.duration
    result["cpu_us_per_ok"] = cpu / ok * 1e6 if ok else 0.0  # warm-up included: an upper bound
    return result


def run_setting(name: str, settings: str, args, repo: str, body, body_path: str, wrk: Wrk, tmp: str,
                closers: list) -> tuple[list[dict], list[dict]]:
    config = os.path.join(tmp, f"{name.replace(' ', '-')}.yaml")
    with open(config, "w") as f:
        f.write(settings)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = ManagedProcess(["taskset", "-c", args.server_cpus, sys.executable, "-m", "aclserve", "serve",
                             "--config", config, "--models", repo, "--port", str(port), "--grpc-port", "0",
                             "--model-control-mode", "none", "--log-level", "warning", "--cpu-threads", "1"],
                            os.path.join(tmp, f"server-{port}.log"), cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    closers.append(server)
    wait_ready(server, base, args.start_timeout)
    url = f"{base}/v2/models/medium/infer"
    rows = []
    for conc in [args.capacity_conc, *args.conc]:
        if args.warmup > 0:
            wrk.run(url, body, conc, args.warmup)
        row = window(wrk, url, body, conc, args.duration, server, f"{name} c={conc}")
        row["setting"] = name
        rows.append(row)
        print(f"  {name} c={conc}: {row['ok_per_s']:.0f} x 200/s, {row['refused_per_s']:.0f} refused/s",
              file=sys.stderr, flush=True)
    capacity = rows[0]["ok_per_s"]
    for row in rows:
        row["share_of_capacity"] = row["ok_per_s"] / capacity if capacity else 0.0
    open_rows = []
    for load in args.open_loads:
        row = open_window(args, url, body_path, body, load * capacity, server, f"{name} open loop {load:g}x")
        row.update(setting=name, load=load, share_of_capacity=row["ok_per_s"] / capacity if capacity else 0.0)
        open_rows.append(row)
        print(f"  {name} open loop {load:g}x: {row['ok_per_s']:.0f} x 200/s, {row['per_s']}", file=sys.stderr,
              flush=True)
    stop_server(server, "bench_overload")
    return rows, open_rows


def print_table(rows: list[dict]) -> None:
    print("| setting | connections | 200/s | share of capacity | refused (503)/s | server CPU us per 200 "
          "| p50 of all answers ms | socket errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['conc']} | {r['ok_per_s']:,.0f} | {r['share_of_capacity']:.2f} | "
              f"{r['refused_per_s']:,.0f} | {r['cpu_us_per_ok']:.0f} | {r['latency_p50_ms']:.1f} | {r['socket_errors']} |")


def print_open_table(rows: list[dict], timeout_s: float) -> None:
    print(f"\nOpen loop (Poisson arrivals, keep-alive pool of at most 4,000 connections, clients give up "
          f"after {timeout_s:g} s):\n")
    print("| setting | offered (x capacity) | 200/s | share of capacity | 503/s | client timeouts/s | other/s "
          "| 200s p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per_s = r["per_s"]
        other = sum(v for k, v in per_s.items() if k not in ("200", "503", "timeout"))
        print(f"| {r['setting']} | {r['offered_per_s']:,.0f} ({r['load']:g}x) | {r['ok_per_s']:,.0f} | "
              f"{r['share_of_capacity']:.2f} | {per_s.get('503', 0):,.0f} | {per_s.get('timeout', 0):,.0f} | "
              f"{other:,.0f} | {r['p50_ms']:.0f} / {r['p99_ms']:.0f} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("bench_overload", lambda: run(args))


def run(args) -> int:
    require_wrk()  # (before the model is built and a server started)
    closers: list = []
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        try:
            rows, open_rows = measure(args, tmp, closers)
        finally:  # the servers before their folder goes
            for c in reversed(closers):
                c.close()
    print_table(rows)
    if open_rows:
        print_open_table(open_rows, args.client_timeout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows, "open_loop": open_rows},
                      f, indent=1)
    bad = sum(r["socket_errors"] for r in rows)
    if bad:  # (a refusal is a 503, counted apart: a socket error is a connection the server failed)
        print(f"\nFAIL: {bad} wrk socket errors (connect, read, write, timeout; see the last column)",
              file=sys.stderr)
    return 1 if bad else 0


def measure(args, tmp: str, closers: list) -> tuple[list[dict], list[dict]]:
    repo = os.path.join(tmp, "repo")
    os.makedirs(repo)
    onnx = prepare_repository(args.models_src, repo, only=("medium",))
    body = make_bodies(RawOrt(onnx["medium"], 1, cpu_set(args.server_cpus)))[args.body][1]
    body_path = os.path.join(tmp, "body.bin")
    with open(body_path, "wb") as f:
        f.write(body.data)
    wrk = Wrk(args.client_cpus, count_non2xx=True)
    closers.append(wrk)
    print(f"medium CNN, {args.body} bodies, server on CPU {args.server_cpus}, wrk -t1 on CPU {args.client_cpus}, "
          f"{args.duration:g} s windows; capacity = {args.capacity_conc} connections\n")
    rows, open_rows = [], []
    for name in args.settings:
        closed, opened = run_setting(name, SETTINGS[name], args, repo, body, body_path, wrk, tmp, closers)
        rows += closed
        open_rows += opened
    return rows, open_rows

if __name__ == "__main__":
    sys.exit(main())
