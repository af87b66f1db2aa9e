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
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aclserve.acl.check import AclError  # noqa: E402
from aclserve.cli import load as profile_load  # noqa: E402  (the closed loop `aclserve profile` drives)
from aclserve.errors import LoadError, QueueFull, RequestTimeout, ServeError, ShuttingDown  # noqa: E402
from aclserve.om.compile import CompileError, compile_model  # noqa: E402
from aclserve.runtime import AclRuntime, open_pool, warm_up  # noqa: E402
from aclserve.scheduling import BatchingConfig, DynamicBatcher, QueuePolicy  # noqa: E402
from bench_args import (fraction, non_negative_float, non_negative_int, positive_float,  # noqa: E402
                        positive_floats, positive_int)
from bench_common import ensure_model  # noqa: E402
from bench_run import BenchFailed, run_async, run_tool  # noqa: E402

GEARS = [1, 2, 4, 8, 16, 32]
LEVELS = (1, 2)  # the levels this load uses: 1 = high, 2 = the default
LAG_WARN_MS = 5.0  # arrivals later than this (p99) mean the generator, not the model, was the limit


def pin_process(cpu: int) -> None:
    """Pin every existing thread (and so every thread they start) to one CPU."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:
            pass


def batch_figures(batcher: DynamicBatcher) -> dict:
    stats = batcher.stats
    runs = sum(stats.gear_batches.values())
    return {"runs": runs, "rows": stats.rows, "padding_rows": stats.padding_rows,
            "mean_batch": stats.rows / runs if runs else 0.0,
            "padding_waste": stats.padding_ratio(),
            "gear_runs": {str(g): n for g, n in sorted(stats.gear_batches.items(), key=lambda i: i[0] or 0)}}


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    a = np.asarray(values) * 1000.0
    return {"n": len(values), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


async def closed_loop(pool, sample, config: BatchingConfig, concurrency: int, warm: float,
                      seconds: float) -> dict:
    """`concurrency` submitters, each sending its next request when the previous is answered or
    refused (the closed loop of `aclserve profile`); completions inside the window [warm, warm +
    seconds] count, refusals are counted by why. A fresh batcher per call."""
    loop = asyncio.get_running_loop()
    batcher = DynamicBatcher(pool, config=config, name="closed")
    start = loop.time()
    window = (start + warm, start + warm + seconds)
    done_in_window = 0

    async def one() -> str | None:
        nonlocal done_in_window
        try:
            await batcher.infer(sample, 1)
        except ServeError as e:  # QueueFull comes before infer awaits anything: a submitter retrying
            await asyncio.sleep(REFUSED_PAUSE_S)  # at once, or after a bare yield, starved the batcher
            return type(e).__name__  # (0 req/s; a few batches a window), as no client over HTTP can
        if window[0] <= loop.time() <= window[1]:
            done_in_window += 1
        return None

    try:
        outcomes = await profile_load.closed_loop(concurrency, warm + seconds, one)
    finally:
        await retire(batcher, pool)
    stats = batcher.stats
    return {"done": done_in_window, "seconds": seconds, "errors": sum(outcomes.refused.values()),
            "refused": dict(outcomes.refused), "rows": stats.rows, "padding_rows": stats.padding_rows,
            "gear_batches": dict(stats.gear_batches)}


RETIRE_TIMEOUT_S = 60.0
# how long a refused submitter waits before it asks again: over HTTP a refusal takes a round trip
# (and says Retry-After); in process it is immediate, and a yield alone left the loop no idle
# moment for the batcher's hand-offs (3 batches in 0.35 s with 14 of 16 submitters refused)
REFUSED_PAUSE_S = 0.001
# what the in-process runtime raises for a failed measurement (a model that does not compile or
# load, a device call or a run failed: ACLSERVE_CPU_FAULTS makes them), said in one line by run_tool
MEASURED = (CompileError, LoadError, AclError, ServeError)


async def retire(batcher: DynamicBatcher, pool) -> None:
    """Close `batcher` and free `pool` for the next window's batcher: a pool takes one listener,
    and batches the closed batcher sent still answer it, so it is let go once they have."""
    await batcher.close()
    deadline = time.monotonic() + RETIRE_TIMEOUT_S
    while pool.lanes() != [len(instance.slots) for instance in pool.instances]:
        if time.monotonic() > deadline:  # (a batch never answered, or an instance out of service)
            raise BenchFailed(f"{pool.name}: batches still running {RETIRE_TIMEOUT_S:g} s after the window ended")
        await asyncio.sleep(0.005)
    pool.attach(None)


def merge_closed(rounds: list[dict]) -> dict:
    """One mode's figures over its rounds: throughput = all completions / all window time."""
    gear_batches: dict = {}
    refused: collections.Counter = collections.Counter()
    for r in rounds:
        for gear, n in r["gear_batches"].items():
            gear_batches[gear] = gear_batches.get(gear, 0) + n
        refused.update(r["refused"])
    runs = sum(gear_batches.values())
    rows = sum(r["rows"] for r in rounds)
    padding = sum(r["padding_rows"] for r in rounds)
    return {"req_per_s": sum(r["done"] for r in rounds) / sum(r["seconds"] for r in rounds),
            "rounds_req_per_s": [r["done"] / r["seconds"] for r in rounds],
            "errors": sum(r["errors"] for r in rounds), "refused": dict(refused), "runs": runs, "rows": rows,
            "padding_rows": padding, "mean_batch": rows / runs if runs else 0.0,
            "padding_waste": padding / (rows + padding) if rows + padding else 0.0,
            "gear_runs": {str(g): n for g, n in sorted(gear_batches.items(), key=lambda i: i[0] or 0)}}


async def open_loop(pool, sample, config: BatchingConfig, rate: float, seconds: float, high: float,
                    timeout_us: int | None, drain_timeout: float, seed: int) -> dict:
    """Poisson arrivals at `rate` req/s for `seconds`, one task per arrival, never waiting for
    answers; then wait up to `drain_timeout` for the rest (closing the batcher fails leftovers)."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(seed)
    n = int(rate * seconds * 1.5) + 100
    offsets = np.cumsum(rng.exponential(1.0 / rate, n))
    offsets = offsets[offsets < seconds]
    priorities = np.where(rng.random(len(offsets)) < high, 1, 2)
    batcher = DynamicBatcher(pool, config=config, name=f"open{rate:.0f}")
    latency = {level: [] for level in LEVELS}
    outcome = {level: {"ok": 0, "queue_full": 0, "timed_out": 0, "other_error": 0, "unfinished": 0}
               for level in LEVELS}
    end_of_window = [0.0]
    completed_in_window = [0]

    async def one(arrival: float, level: int):
        try:
            # the default level is reached by sending no priority, as most clients do
            await batcher.infer(sample, 1, priority=1 if level == 1 else None, timeout_us=timeout_us)
        except QueueFull:
            outcome[level]["queue_full"] += 1
            return
        except RequestTimeout:
            outcome[level]["timed_out"] += 1
            return
        except ShuttingDown:  # still queued or running when the drain gave up
            outcome[level]["unfinished"] += 1
            return
        except ServeError:
            outcome[level]["other_error"] += 1
            return
        now = loop.time()
        latency[level].append(now - arrival)
        outcome[level]["ok"] += 1
        if now <= end_of_window[0]:
            completed_in_window[0] += 1

    start = loop.time() + 0.005
    end_of_window[0] = start + seconds
    arrivals = start + offsets
    tasks: list[asyncio.Task] = []
    lags, i = [], 0
    while i < len(arrivals):
        now = loop.time()
        while i < len(arrivals) and arrivals[i] <= now:  # launch the burst that is due
            level = int(priorities[i])
            tasks.append(loop.create_task(one(float(arrivals[i]), level)))
            lags.append(now - arrivals[i])
            i += 1
        if i < len(arrivals):
            await asyncio.sleep(max(arrivals[i] - loop.time(), 0.0))
    pending = (await asyncio.wait(tasks, timeout=drain_timeout))[1] if tasks else set()
    drained_at = loop.time()
    await retire(batcher, pool)  # fails whatever is left with ShuttingDown
    if pending:
        await asyncio.wait(pending)
    lag_ms = {"p99": float(np.percentile(lags, 99)) * 1000 if lags else 0.0,
              "max": max(lags, default=0.0) * 1000}
    levels = {}
    for level in LEVELS:
        stats = batcher.stats.levels[level]
        levels[level] = {**percentiles_ms(latency[level]), **outcome[level],
                         "sent": int((priorities == level).sum()),
                         "batcher_rejected": stats.rejected, "batcher_timed_out": stats.timed_out}
    completed = sum(outcome[level]["ok"] for level in LEVELS)
    return {"offered_req_per_s": len(arrivals) / seconds, "sent": len(arrivals),
            "completed": completed, "completed_in_window_per_s": completed_in_window[0] / seconds,
            "completed_per_s_incl_drain": completed / max(drained_at - start, 1e-9),
            "drain_s": max(drained_at - end_of_window[0], 0.0), "generator_lag_ms": lag_ms,
            "levels": levels, **batch_figures(batcher)}


def fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(result: dict) -> None:
    cap, off = result["capacity"], result["batching_off"]
    print(f"\nmodel {result['model']}, gears {result['gears']}, instances {result['instances']} x "
          f"slots {result['slots']}, ORT threads {result['threads']}, cpus {result['cpus']}, "
          f"max_queue_delay_ms {result['max_queue_delay_ms']}, concurrency {result['concurrency']}\n")
    print("| closed loop | req/s | per round | mean batch | padding waste | runs per gear | errors |")
    print("|---|---:|---|---:|---:|---|---:|")
    for label, r in (("batching on", cap), ("batching off", off)):
        rounds = " ".join(f"{x:.0f}" for x in r["rounds_req_per_s"])
        print(f"| {label} | {r['req_per_s']:.0f} | {rounds} | {r['mean_batch']:.2f} | {r['padding_waste']:.1%} | "
              f"{', '.join(f'{g}:{n}' for g, n in r['gear_runs'].items())} | {refusals(r)} |")
    print(f"\nbatching on/off throughput ratio: {result['on_off_ratio']:.2f}\n")
    print("| load | offered req/s | completed req/s | offered/completed | p50 / p99 ms (prio 1) | p50 / p99 ms (prio 2) "
          "| mean batch | padding waste | rejected 1/2 | timed out 1/2 | unfinished 1/2 | drain s |")
    print("|---|---:|---:|---:|---|---|---:|---:|---|---|---|---:|")
    for r in result["open_loop"]:
        l1, l2 = r["levels"][1], r["levels"][2]
        print(f"| {r['load']:.0%} | {r['offered_req_per_s']:.0f} | {r['completed_in_window_per_s']:.0f} | "
              f"{r['offered_req_per_s'] / max(r['completed_in_window_per_s'], 1e-9):.2f} | "
              f"{fmt(l1['p50_ms'])} / {fmt(l1['p99_ms'])} | {fmt(l2['p50_ms'])} / {fmt(l2['p99_ms'])} | "
              f"{r['mean_batch']:.2f} | {r['padding_waste']:.1%} | {l1['queue_full']}/{l2['queue_full']} | "
              f"{l1['timed_out']}/{l2['timed_out']} | {l1['unfinished']}/{l2['unfinished']} | "
              f"{r['drain_s']:.2f} |")
    print("\ncompleted req/s = answered within the arrival window / window; latency = scheduled "
          "arrival -> answer, so generator lag counts (lag p99 / max per load: "
          + ", ".join(f"{r['load']:.0%} {r['generator_lag_ms']['p99']:.1f} / {r['generator_lag_ms']['max']:.1f} ms"
                      for r in result["open_loop"]) + ")")
    for r in result["open_loop"]:
        if r["generator_lag_ms"]["p99"] > LAG_WARN_MS:
            print(f"warning: at {r['load']:.0%} the arrival generator fell behind (lag p99 "
                  f"{r['generator_lag_ms']['p99']:.1f} ms): the event loop thread ran late (CPU "
                  "contention or a saturated loop), so arrivals came late and in bursts; latencies "
                  "include that lag")
    for check in result["checks"]:
        print(f"check: {check['name']}: {check['verdict']} ({check['detail']})")


def refusals(closed: dict) -> str:
    """A closed loop's errors: "0", or "12,928 (QueueFull)", as `aclserve profile` says them."""
    return profile_load.Outcomes(refused=collections.Counter(closed["refused"])).refusals() if closed["errors"] else "0"


def errors_check(result: dict) -> dict:
    """Any request that failed fails the run: a closed loop's refusals leave its req/s no capacity
    (64 submitters against a queue of 48), and what failed in the open loop for another reason
    than a full queue, a timeout or the drain's end is no latency of the model."""
    on, off = result["capacity"], result["batching_off"]
    other = sum(r["levels"][level]["other_error"] for r in result["open_loop"] for level in LEVELS)
    ok = not (on["errors"] or off["errors"] or other)
    return {"name": "no request errors", "ok": ok, "verdict": "PASS" if ok else "FAIL",
            "detail": f"closed loop: batching on {refusals(on)}, off {refusals(off)}; open loop: {other} failed "
                      "otherwise than by a full queue, a timeout or the drain's end"}


def checks(result: dict) -> list[dict]:
    out = [errors_check(result)]
    saturated = max(result["open_loop"], key=lambda r: r["load"])
    l1, l2 = saturated["levels"][1], saturated["levels"][2]
    ok = l1["p99_ms"] is not None and l2["p50_ms"] is not None and l1["p99_ms"] < l2["p50_ms"]
    out.append({"name": f"at {saturated['load']:.0%} load, priority-1 p99 < priority-2 p50", "ok": ok,
                "verdict": "PASS" if ok else "FAIL",
                "detail": f"{fmt(l1['p99_ms'])} ms vs {fmt(l2['p50_ms'])} ms; offered/completed "
                          f"{saturated['offered_req_per_s'] / max(saturated['completed_in_window_per_s'], 1e-9):.2f}"})
    on, off = result["capacity"], result["batching_off"]
    # "beats" only when every on round beat every off round; a win inside the round-to-round
    # spread is reported as inconclusive rather than as a pass
    clear = min(on["rounds_req_per_s"]) > max(off["rounds_req_per_s"])
    verdict = "PASS" if clear else "INCONCLUSIVE" if on["req_per_s"] > off["req_per_s"] else "FAIL"
    out.append({"name": "batching on beats batching off", "ok": clear, "verdict": verdict,
                "detail": f"{on['req_per_s']:.0f} vs {off['req_per_s']:.0f} req/s, ratio {result['on_off_ratio']:.2f}; "
                          f"rounds on {min(on['rounds_req_per_s']):.0f}..{max(on['rounds_req_per_s']):.0f}, "
                          f"off {min(off['rounds_req_per_s']):.0f}..{max(off['rounds_req_per_s']):.0f}"})
    return out


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
    ap = argparse.ArgumentParser(usage=USAGE, description=__doc__.split("\n\n")[0], epilog=MODES_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("medium", "light"), default="medium")
    ap.add_argument("--seconds", type=positive_float, default=5.0, help="open-loop arrival window per load")
    ap.add_argument("--capacity-seconds", type=positive_float, default=3.0,
                    help="closed-loop window per mode (all rounds)")
    ap.add_argument("--rounds", type=positive_int, default=3, help="closed-loop on/off alternations")
    ap.add_argument("--warm", type=non_negative_float, default=0.3, help="closed-loop seconds before each window")
    ap.add_argument("--concurrency", type=positive_int, default=64, help="closed-loop submitters")
    ap.add_argument("--loads", type=positive_floats, default="0.8,1.2",
                    help="open-loop rates as fractions of capacity")
    ap.add_argument("--high", type=fraction, default=0.10, help="fraction of requests at priority 1")
    ap.add_argument("--delay-ms", type=non_negative_float, default=1.0, help="max_queue_delay_ms")
    ap.add_argument("--max-queue", type=non_negative_int, default=0, help="max_queue_size per level (0 = unbounded)")
    ap.add_argument("--timeout-ms", type=non_negative_float, default=0.0, help="per-request queue timeout (0 = none)")
    ap.add_argument("--drain-timeout", type=positive_float, default=30.0, help="seconds to wait for answers")
    ap.add_argument("--instances", type=positive_int, default=1)
    ap.add_argument("--slots", type=positive_int, default=2)
    ap.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--cpu", type=int, default=1,
                    help="pin the process to this CPU, like the server benchmark (-1: do not pin)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    if args.cpu < 0:
        args.cpu = None
    return args


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
