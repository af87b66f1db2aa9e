#!/usr/bin/env python3
"""Tracing overhead, measured side by side: the server's throughput with tracing OFF and ON
(`trace_rate` 1000 by default, written to a file every 100 traces), in alternating rounds.

The server runs pinned to one core (--server-cpus), wrk on another (--client-cpus), both as
bench_server.py does; each round is `--seconds` of closed-loop load at `--connections`, and the
setting flips between rounds through POST /v2/trace/setting on the running server (the same
process, so nothing else changes). The light case is the worst one for a relative overhead: the
digits model (`models/digits.om`, 64 numbers in, 10 out) as a JSON body, where the server's
per-request work is smallest. A third setting traces every request (rate 1), so the cost of one
traced request is measured too. Prints req/s and the server's CPU time per request (user +
system, all threads, /proc/<pid>/stat) per round, the ratios to OFF of the medians, and what
the rate-1 cost implies at the chosen rate: (CPU(rate 1) - CPU(OFF)) / rate / CPU(OFF). On a
shared machine req/s moves with the neighbours' load; CPU per request much less.

    python tools/bench_trace.py [--rounds 6] [--seconds 5] [--rate 1000] [--connections 16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_common import Body, ManagedProcess, Wrk, cpu_seconds, free_port, http, wait_ready  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds per setting (alternating)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=int, default=1000, help="trace_rate while ON")
    ap.add_argument("--server-cpus", default="1")
    ap.add_argument("--client-cpus", default="0")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = ManagedProcess(["taskset", "-c", args.server_cpus, sys.executable, "-m", "aclserve", "serve",
                                 "--models", os.path.join(ROOT, "models"), "--port", str(port), "--grpc-port", "0",
                                 "--model-control-mode", "none", "--log-level", "warning"],
                                os.path.join(tmp, "server.log"), cwd=tmp, env=dict(os.environ, PYTHONPATH=ROOT))
        wrk = Wrk(args.client_cpus)
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
            rates: dict[str, list[float]] = {name: [] for name in settings}
            cpu_us: dict[str, list[float]] = {name: [] for name in settings}
            print(f"digits JSON, {args.connections} connections, {args.seconds:g} s rounds, "
                  f"server on cpu {args.server_cpus}, wrk on cpu {args.client_cpus}, trace_rate {args.rate}")
            for r in range(args.rounds):
                order = list(settings)
                for name in order[r % 3:] + order[:r % 3]:
                    http(f"{base}/v2/trace/setting", json.dumps(settings[name]).encode(),
                         {"Content-Type": "application/json"})
                    cpu0 = cpu_seconds(server.proc.pid)
                    result = wrk.run(url, body, args.connections, args.seconds)
                    cpu_us[name].append((cpu_seconds(server.proc.pid) - cpu0) / max(result["requests"], 1) * 1e6)
                    if result["errors"]["status"] or result["socket_errors"]:
                        raise RuntimeError(f"errors in round {r} ({name}): {result['errors']}")
                    rates[name].append(result["rps"])
                    print(f"round {r + 1} {name:>5}: {result['rps']:>9,.0f} req/s  {cpu_us[name][-1]:6.1f} CPU us/req  "
                          f"p99 {result['latency_us']['p99'] / 1000:.2f} ms", flush=True)
            http(f"{base}/v2/trace/setting", json.dumps(off).encode(), {"Content-Type": "application/json"})
            med_off, med_on = statistics.median(rates["off"]), statistics.median(rates["on"])
            traced = len(os.listdir(os.path.join(tmp, "traces"))) if os.path.isdir(os.path.join(tmp, "traces")) else 0
            cpu_off, cpu_on = statistics.median(cpu_us["off"]), statistics.median(cpu_us["on"])
            cpu_every = statistics.median(cpu_us["every"])
            print(f"median req/s: OFF {med_off:,.0f}, rate {args.rate} {med_on:,.0f} (ON/OFF {med_on / med_off:.3f}), "
                  f"rate 1 {statistics.median(rates['every']):,.0f}")
            print(f"median CPU us/req: OFF {cpu_off:.1f}, rate {args.rate} {cpu_on:.1f} (ON/OFF {cpu_on / cpu_off:.3f}), "
                  f"rate 1 {cpu_every:.1f}: a traced request costs {cpu_every - cpu_off:.1f} us more, so rate "
                  f"{args.rate} adds {(cpu_every - cpu_off) / args.rate / cpu_off:.3%} of CPU per request; "
                  f"{traced} trace file(s) written")
        finally:
            wrk.close()
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
