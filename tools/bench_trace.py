#!/usr/bin/env python3
"""Tracing overhead, measured side by side: the server's throughput with tracing OFF and ON
(`trace_rate` 1000 by default, written to a file every 100 traces), in alternating rounds.

The server runs pinned to one core (--server-cpus), wrk on another (--client-cpus), both as
bench_server.py does; each round is `--seconds` of closed-loop load at `--connections`, and the
setting flips between rounds through POST /v2/trace/setting on the running server (the same
process, so nothing else changes), in back-to-back pairs (OFF then ON, then ON then OFF, ...),
compared pair by pair. The light case is the worst one for a relative overhead: the
digits model (`models/digits.om`, 64 numbers in, 10 out) as a JSON body, where the server's
per-request work is smallest. Pairs of OFF and rate 1 (every request traced), run after the others,
measure the cost of one traced request. Prints req/s and the server's CPU time per request (user +
system, all threads, /proc/<pid>/stat) per round and the ratios to OFF of the medians. On a
shared machine these move with the neighbours' load by more than the effect, so it also times
the sampling decision every request pays while tracing is on (Observer.begin, in this process)
and prints the cost implied at the chosen rate: (sampling + (CPU(rate 1) - CPU(OFF)) / rate) /
CPU(OFF).

    python tools/bench_trace.py [--rounds 10] [--seconds 3] [--rate 1000] [--connections 16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import timeit

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_args import cpu_list, positive_int, whole_seconds  # noqa: E402
from bench_common import ManagedProcess, cpu_seconds, free_port, http, wait_ready  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_tool  # noqa: E402
from bench_wrk import Body, Wrk, require_wrk  # noqa: E402


def sampling_ns(rate: int, calls: int = 500_000) -> float:
    """What deciding whether to trace one request costs while tracing is on (not traced)."""
    sys.path.insert(0, ROOT)
    from aclserve.server.observe import Observer
    from aclserve.trace import Tracer, TraceSettings
    observer = Observer(Tracer(TraceSettings(level="TIMESTAMPS", rate=rate)), False)
    spent = timeit.timeit(lambda: observer.begin("digits", "1", "http", 0), number=calls)
    empty = timeit.timeit(lambda: None, number=calls)
    return (spent - empty) / calls * 1e9


def main() -> int:
    # (a default run: 10 pairs and 3 pairs of 3 s rounds, 78 s, and the server's start and the sampling timing)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " A default run takes about 1.5 minutes.")
    ap.add_argument("--rounds", type=positive_int, default=10,
                    help="pairs of OFF and rate-N rounds (default %(default)s; then a third as many, at least 2, "
                         "of OFF and rate 1)")
    ap.add_argument("--seconds", type=whole_seconds, default=3,
                    help="seconds per round (default %(default)s; whole seconds, as wrk takes them: a fraction is "
                         "rounded up)")
    ap.add_argument("--connections", type=positive_int, default=16, help="wrk connections (default %(default)s)")
    ap.add_argument("--rate", type=positive_int, default=1000, help="trace_rate while ON (default %(default)s)")
    ap.add_argument("--server-cpus", type=cpu_list, default="1",
                    help="taskset list for the server (default %(default)s)")
    ap.add_argument("--client-cpus", type=cpu_list, default="0", help="taskset list for wrk (default %(default)s)")
    args = ap.parse_args()
    return run_tool("bench_trace", lambda: run(args))


def run(args) -> int:
    require_wrk()  # (before its server starts)
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        wrk = Wrk(args.client_cpus)
        server = ManagedProcess(["taskset", "-c", args.server_cpus, sys.executable, "-m", "aclserve", "serve",
                                 "--models", os.path.join(ROOT, "models"), "--port", str(port), "--grpc-port", "0",
                                 "--model-control-mode", "none", "--log-level", "warning"],
                                os.path.join(tmp, "server.log"), cwd=tmp, env=dict(os.environ, PYTHONPATH=ROOT))
        try:
            wait_ready(server, base, 120)
            doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
            body = Body(json.dumps(doc).encode(), "application/json")
            url = f"{base}/v2/models/digits/infer"
            wrk.run(url, body, args.connections, 2)  # warm-up
            on = {"trace_level": ["TIMESTAMPS"], "trace_rate": str(args.rate), "trace_file": "overhead.json",
                  "log_frequency": "100"}
            off = {"trace_level": ["OFF"]}
            every = dict(on, trace_rate="1", trace_file="every.json", log_frequency="1000")
            settings = {"off": off, "on": on, "every": every}
            print(f"digits JSON, {args.connections} connections, {args.seconds:g} s rounds, "
                  f"server on cpu {args.server_cpus}, wrk on cpu {args.client_cpus}, trace_rate {args.rate}")

            def measure(label: str, name: str) -> tuple[float, float]:
                """(req/s, server CPU us per request) of one round under settings[name]."""
                http(f"{base}/v2/trace/setting", json.dumps(settings[name]).encode(), {"Content-Type": "application/json"})
                cpu0 = cpu_seconds(server.proc.pid)
                try:
                    result = wrk.run(url, body, args.connections, args.seconds)
                finally:
                    ensure_running(server, f"{label} ({name})")
                cpu = (cpu_seconds(server.proc.pid) - cpu0) / max(result["requests"], 1) * 1e6
                if result["errors"]["status"] or result["socket_errors"]:
                    raise BenchFailed(f"errors in {label} ({name}): {result['errors']}")
                print(f"{label} {name:>5}: {result['rps']:>9,.0f} req/s  {cpu:6.1f} CPU us/req  "
                      f"p99 {result['latency_us']['p99'] / 1000:.2f} ms", flush=True)
                return result["rps"], cpu

            def pairs(other: str, rounds: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
                """Rounds of (OFF, other) measured back to back, the order alternating."""
                out = []
                for r in range(rounds):
                    first, second = ("off", other) if r % 2 == 0 else (other, "off")
                    a = measure(f"pair {r + 1}", first)
                    b = measure(f"pair {r + 1}", second)
                    out.append((a, b) if first == "off" else (b, a))
                return out

            sampled = pairs("on", args.rounds)
            every = pairs("every", max(2, args.rounds // 3))  # after the others: its garbage stays out of them
            http(f"{base}/v2/trace/setting", json.dumps(off).encode(), {"Content-Type": "application/json"})
            traced = len(os.listdir(os.path.join(tmp, "traces"))) if os.path.isdir(os.path.join(tmp, "traces")) else 0
            rate_ratio = statistics.median(on[0] / o[0] for o, on in sampled)
            cpu_ratio = statistics.median(on[1] / o[1] for o, on in sampled)
            cpu_off = statistics.median(o[1] for o, _ in sampled)
            extra = statistics.median(e[1] - o[1] for o, e in every)
            print(f"rate {args.rate} against OFF, median of {len(sampled)} back-to-back pairs: throughput "
                  f"{rate_ratio:.3f}, CPU per request {cpu_ratio:.3f} (OFF: {cpu_off:.1f} us per request); "
                  f"{traced} trace file(s) written")
            decide = sampling_ns(args.rate) / 1000
            implied = decide + extra / args.rate
            print(f"rate 1 against OFF: a traced request costs {extra:.1f} us more; the sampling decision costs "
                  f"{decide * 1000:.0f} ns per request; so rate {args.rate} costs {implied:.2f} us per request, "
                  f"{implied / cpu_off:.2%} of an untraced request")
        finally:
            wrk.close()
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
