"""The two loads tools/bench_batching.py puts on a batcher in process, each on a fresh
DynamicBatcher over one pool, and their figures: the closed loop (`--concurrency` submitters, the
capacity with batching on or off, merged over rounds) and the open loop (Poisson arrivals at two
priority levels, latency from each scheduled arrival)."""
from __future__ import annotations

import asyncio
import collections
import time

import numpy as np

from aclserve.cli import load as profile_load  # (the closed loop `aclserve profile` drives)
from aclserve.errors import QueueFull, RequestTimeout, ServeError, ShuttingDown
from aclserve.scheduling import BatchingConfig, DynamicBatcher
from bench_run import BenchFailed

LEVELS = (1, 2)  # the levels the open loop uses: 1 = high, 2 = the default
RETIRE_TIMEOUT_S = 60.0
# how long a refused submitter waits before it asks again: over HTTP a refusal takes a round trip
# (and says Retry-After); in process it is immediate, and a yield alone left the loop no idle
# moment for the batcher's hand-offs (3 batches in 0.35 s with 14 of 16 submitters refused)
REFUSED_PAUSE_S = 0.001


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

    async def one(_number: int) -> str | None:  # (its number in the loop: `aclserve profile` names its requests by it)
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
