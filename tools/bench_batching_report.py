"""The verdicts and printed report of tools/bench_batching.py: its checks (no request errors, which
alone decides the exit status; priority 1 ahead of priority 2 when saturated; batching on beating
off) and the closed-loop and open-loop Markdown tables with the arrival generator's lag."""
from __future__ import annotations

import collections

from aclserve.cli import load as profile_load  # (a closed loop's refusals, said as `aclserve profile` says them)
from bench_batching_loops import LEVELS

LAG_WARN_MS = 5.0  # arrivals later than this (p99) mean the generator, not the model, was the limit


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
    print("| load | offered req/s | completed req/s | offered/completed | p50 / p99 ms (prio 1) "
          "| p50 / p99 ms (prio 2) | mean batch | padding waste | rejected 1/2 | timed out 1/2 | unfinished 1/2 "
          "| drain s |")
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
