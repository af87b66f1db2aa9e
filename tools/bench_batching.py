#!/usr/bin/env python3
"""Batching benchmark: priority latency under open-loop load, and batching on vs off, one run.

In-process (no HTTP): measures the scheduler (PriorityQueue + DynamicBatcher) and the runtime
(InstancePool on the CPU ACL implementation) on an example model, one sample per request.

  1. capacity    closed loop, `--concurrency` submitters, batching on  -> capacity req/s
  2. batch off   the same closed loop with BatchingConfig(enabled=False) (one request per run)
  3. open loop   Poisson arrivals at `--loads` x capacity (default 0.8 and 1.2) for `--seconds`
                 each, `--high` of them at priority 1 and the rest at the default level 2,
                 then drain. Latency = scheduled arrival time -> result on the event loop, so
                 queueing and any generator lag count against it.

Prints a Markdown summary (p50/p99 per level, completed throughput, mean executed batch,
padding waste, rejected / timed out per level, on/off ratio, the closed loop's errors) and
the two acceptance checks of issue 5; `--json FILE` writes the same figures. Any request error
(a closed-loop refusal, an open-loop failure other than a full queue, a timeout or the drain's
end) fails the check "no request errors" and the run: exit status 1.

    python tools/bench_batching.py [--model medium|light] [--seconds 5] [--cpu 1 | -1] [--json out.json]

`python tools/bench_batching.py priority [--seconds 6] [--rounds 2]` runs the closed-loop
priority benchmark over HTTP instead (24 clients at the lowest level, 3 at the highest, a real
server, client processes; tools/bench_priority.py has the details).

This module holds the options, the set-up (model, runtime, pool) and the order of the run; the
loads are tools/bench_batching_loops.py, the tables and checks tools/bench_batching_report.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aclserve.acl.check import AclError  # noqa: E402
from aclserve.errors import LoadError, ServeError  # noqa: E402
from aclserve.om.compile import CompileError, compile_model  # noqa: E402
from aclserve.runtime import AclRuntime, open_pool, warm_up  # noqa: E402
from aclserve.scheduling import BatchingConfig, QueuePolicy  # noqa: E402
from bench_args import (cpu_or_none, fraction, non_negative_float, non_negative_int, positive_float,  # noqa: E402
                        positive_floats, positive_int)
from bench_batching_loops import closed_loop, merge_closed, open_loop  # noqa: E402
from bench_batching_report import checks, errors_check, refusals, report  # noqa: E402
from bench_models import ensure_model  # noqa: E402
from bench_run import BenchFailed, run_async, run_tool  # noqa: E402

GEARS = [1, 2, 4, 8, 16, 32]
# what the in-process runtime raises for a failed measurement (a model that does not compile or
# load, a device call or a run failed: ACLSERVE_CPU_FAULTS makes them), said in one line by run_tool
MEASURED = (CompileError, LoadError, AclError, ServeError)


def pin_process(cpu: int) -> None:
    """Pin every existing thread (and so every thread they start) to one CPU."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:
            pass


async def run(args, pool) -> dict:
    spec = pool.inputs[0]
    sample = {s.name: np.random.default_rng(1).standard_normal((1,) + s.sample_shape).astype(s.dtype)
              for s in pool.inputs}
    assert spec.batched, "the benchmark needs a model with a batch dimension"
    base = dict(max_queue_delay_ms=args.delay_ms,
                default_queue_policy=QueuePolicy(max_queue_size=args.max_queue))
    on = BatchingConfig(enabled=True, **base)
    off = BatchingConfig(enabled=False, **base)
    # on and off alternate in rounds so a drift in background load hits both modes alike
    per_round = args.capacity_seconds / args.rounds
    print(f"closed loop, {args.concurrency} submitters, batching on/off alternating, "
          f"{args.rounds} x {per_round:g} s each ...", flush=True)
    rounds = {True: [], False: []}
    for _ in range(args.rounds):
        for config in (on, off):
            rounds[config.enabled].append(
                await closed_loop(pool, sample, config, args.concurrency, args.warm, per_round))
    capacity, batching_off = merge_closed(rounds[True]), merge_closed(rounds[False])
    print(f"  on {capacity['req_per_s']:.0f} req/s, off {batching_off['req_per_s']:.0f} req/s; errors: on "
          f"{refusals(capacity)}, off {refusals(batching_off)}", flush=True)
    for label, closed in (("on", capacity), ("off", batching_off)):
        if not closed["req_per_s"]:  # (the open loop's rates are fractions of it: a rate of 0 has no arrivals)
            raise BenchFailed(f"the closed loop with batching {label} completed no request in its windows "
                              f"(errors: {refusals(closed)}): no capacity measured")
    loads = []
    for k, load in enumerate(args.loads):
        rate = load * capacity["req_per_s"]
        print(f"open loop at {load:.0%} = {rate:.0f} req/s for {args.seconds:g} s ...", flush=True)
        r = await open_loop(pool, sample, on, rate, args.seconds, args.high,
                            int(args.timeout_ms * 1000) or None, args.drain_timeout, args.seed + k)
        loads.append({"load": load, "rate": rate, **r})
    return {"capacity": capacity, "batching_off": batching_off, "open_loop": loads,
            "on_off_ratio": capacity["req_per_s"] / max(batching_off["req_per_s"], 1e-9)}


USAGE = "%(prog)s [options]\n       %(prog)s priority [options]   (--help there: its own options)"
# (from the options' defaults: 3 rounds x 2 modes x (0.3 + 1) s closed loop, 2 loads x 5 s open loop and
# their drain, the model compiled and warmed up first)
DEFAULT_RUN = " A default run takes about half a minute."
MODES_HELP = """modes:
  (none)    in process, no HTTP: capacity with batching on and off, then open-loop priority
            latency at --loads x capacity (the options above)
  priority  the closed-loop priority benchmark over HTTP: a real server serving one model under
            three configurations, default / slots: 2, just_in_time / slots: 2, when_slot_free
            (tools/bench_priority.py; `%(prog)s priority --help`)"""


def main() -> int:
    if sys.argv[1:2] == ["priority"]:
        import bench_priority
        return bench_priority.main(sys.argv[2:])
    args = parse_args(sys.argv[1:])
    return run_tool("bench_batching", lambda: bench(args), MEASURED)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(usage=USAGE, description=__doc__.split("\n\n")[0] + DEFAULT_RUN, epilog=MODES_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("medium", "light"), default="medium",
                    help="the example model measured (default %(default)s)")
    ap.add_argument("--seconds", type=positive_float, default=5.0,
                    help="open-loop arrival window per load (default %(default)g)")
    ap.add_argument("--capacity-seconds", type=positive_float, default=3.0,
                    help="closed-loop window per mode, all rounds (default %(default)g)")
    ap.add_argument("--rounds", type=positive_int, default=3,
                    help="closed-loop on/off alternations (default %(default)s)")
    ap.add_argument("--warm", type=non_negative_float, default=0.3,
                    help="closed-loop seconds before each window (default %(default)g)")
    ap.add_argument("--concurrency", type=positive_int, default=64, help="closed-loop submitters (default %(default)s)")
    ap.add_argument("--loads", type=positive_floats, default="0.8,1.2",
                    help="open-loop rates as fractions of capacity (default %(default)s)")
    ap.add_argument("--high", type=fraction, default=0.10,
                    help="fraction of requests at priority 1 (default %(default)g)")
    ap.add_argument("--delay-ms", type=non_negative_float, default=1.0, help="max_queue_delay_ms (default %(default)g)")
    ap.add_argument("--max-queue", type=non_negative_int, default=0,
                    help="max_queue_size per level (default %(default)s: unbounded)")
    ap.add_argument("--timeout-ms", type=non_negative_float, default=0.0,
                    help="per-request queue timeout (default %(default)g: none)")
    ap.add_argument("--drain-timeout", type=positive_float, default=30.0,
                    help="seconds to wait for answers (default %(default)g)")
    ap.add_argument("--instances", type=positive_int, default=1, help="model instances (default %(default)s)")
    ap.add_argument("--slots", type=positive_int, default=2, help="slots per instance (default %(default)s)")
    ap.add_argument("--threads", type=positive_int, default=1,
                    help="ONNX Runtime intra-op threads (default %(default)s)")
    ap.add_argument("--cpu", type=cpu_or_none, default="1",
                    help="pin the process to this CPU, like the server benchmark (default %(default)s; -1: do not pin)")
    ap.add_argument("--seed", type=int, default=0, help="the open loop's arrivals (default %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return ap.parse_args(argv)


def bench(args) -> int:
    """The run; its exit status: 1 when a request failed (errors_check)."""
    if args.cpu is not None:
        pin_process(args.cpu)
    onnx_path = ensure_model(args.model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        om = os.path.join(tmp, f"{args.model}.om")
        compile_model(onnx_path, om, batch=GEARS, target="cpu", log=lambda _: None)
        rt = AclRuntime(device="cpu", cpu_threads=args.threads).start()
        try:
            pool = open_pool(rt, om, args.model, instances=args.instances, slots=args.slots)
            try:
                gear_cost = warm_up(pool)
                result = run_async(run(args, pool))  # (a SIGTERM unwinds its tasks, not raised in one of them)
            finally:
                pool.close()
        finally:
            rt.close()
    result.update(model=args.model, gears=GEARS, instances=args.instances, slots=args.slots,
                  threads=args.threads, concurrency=args.concurrency, max_queue_delay_ms=args.delay_ms,
                  cpus=f"pinned to {args.cpu}" if args.cpu is not None else f"{os.cpu_count()} (not pinned)",
                  warmup_gear_cost_ms={str(g): c * 1000 for g, c in gear_cost.items()},
                  command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                  elapsed_s=time.perf_counter() - started)
    result["checks"] = checks(result)
    report(result)
    print(f"\ntotal {result['elapsed_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if errors_check(result)["ok"] else 1  # (the other checks judge the figures, not the run)


if __name__ == "__main__":
    sys.exit(main())
