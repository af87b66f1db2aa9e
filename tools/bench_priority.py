#!/usr/bin/env python3
"""Closed-loop priority benchmark over HTTP; run it as `python tools/bench_batching.py priority`.

A real `aclserve serve` (pinned to one core when there are two) serves the `heavy` benchmark
CNN (tools/make_example_models.py, about 1 ms per row on one core; gears 1,2,4,8, or
--gears; default batching) under three names that differ only in their model configuration,
each labelled by it in what is printed (README's table names them so too):

  default                   no model config: `slots: auto` (1 on the CPU runtime: nothing is ever
                            committed behind a running batch) and batch_formation just_in_time
  slots: 2, just_in_time    two slots (the NPU's default, copies overlapping compute)
  slots: 2, when_slot_free  two slots, batches formed as a slot frees (the rule before
                            just-in-time formation)

Its clients are closed-loop HTTP clients (aiohttp, binary tensor bodies, one sample per
request) in separate processes, pinned to the other core:

  priority     24 clients at priority 3 (the lowest level) in one process and 3 at priority 1
               (the highest) in another, at the same time
  throughput   64 clients at the default level in one process

The modes alternate over `--rounds` rounds so drifting background load hits each alike; each
test runs `--warm` seconds, then counts the requests answered within the next `--seconds`.
Latency is measured by the client, send to full response. Prints a Markdown table and the
project's targets: high p99 / low p50 <= 0.5, and req/s at 64 clients >= 0.97 of that of
`slots: 2, when_slot_free`, for the two others. A configuration with failed requests fails its
targets, and the run exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_args import gears, non_negative_float, positive_float, positive_int  # noqa: E402
from bench_common import ManagedProcess, free_port, http, wait_ready  # noqa: E402
from bench_models import RawOrt, ensure_model  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_async, run_tool, sigterm_as_interrupt  # noqa: E402

GEARS = "1,2,4,8"  # --gears: e.g. 1,2,4,8,16,32, the gears `aclserve compile` gives by default
# each configuration's label (what it sets) and its model YAML; BEFORE: the rule the others are held to
MODES = {"default": "",
         "slots: 2, just_in_time": "slots: 2\nbatching: {batch_formation: just_in_time}\n",
         "slots: 2, when_slot_free": "slots: 2\nbatching: {batch_formation: when_slot_free}\n"}
BEFORE = "slots: 2, when_slot_free"
LOW, HIGH = 3, 1  # the lowest and the highest of the default three levels


# -- the client process ----------------------------------------------------------------------------
def request_body(priority: int | None) -> tuple[bytes, dict]:
    sample = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("<f4")
    raw = sample.tobytes()
    head = {"inputs": [{"name": "x", "shape": [1, 3, 64, 64], "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}
    if priority:
        head["parameters"] = {"priority": priority}
    text = json.dumps(head, separators=(",", ":")).encode()
    return text + raw, {"Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(text))}


async def closed_loop(url: str, clients: int, priority: int | None, start: float, warm: float,
                      seconds: float) -> dict:
    import aiohttp

    body, headers = request_body(priority)
    begin, end = start + warm, start + warm + seconds
    latencies: list[float] = []
    errors = 0

    async def client(session):
        nonlocal errors
        while time.monotonic() < end:
            sent = time.monotonic()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            done = time.monotonic()
            if not ok:
                errors += 1
            elif begin <= done <= end:
                latencies.append(done - sent)

    await asyncio.sleep(max(start - time.monotonic(), 0.0))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return {"latencies": latencies, "errors": errors, "seconds": seconds}


def client_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--start", type=float, required=True, help="time.monotonic() to begin at")
    p.add_argument("--warm", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    a = p.parse_args(argv)
    sigterm_as_interrupt()
    try:
        result = run_async(closed_loop(a.url, a.clients, a.priority or None, a.start, a.warm, a.seconds))
    except KeyboardInterrupt:  # a terminal's Ctrl-C reaches the clients too: the tool says it was interrupted
        return 130
    json.dump(result, sys.stdout)
    return 0


# -- the orchestrator ------------------------------------------------------------------------------
def make_repository(folder: str, onnx_path: str, gears: str) -> None:
    om = os.path.join(folder, "heavy.om")
    subprocess.run([sys.executable, "-m", "aclserve", "compile", onnx_path, "-o", om, "--batch", gears,
                    "--target", "cpu"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    for mode, config in MODES.items():
        shutil.copy(om, os.path.join(folder, f"{model_name(mode)}.om"))
        with open(os.path.join(folder, f"{model_name(mode)}.yaml"), "w") as f:
            f.write(config)
    os.remove(om)


def model_name(mode: str) -> str:
    """The name the server serves a mode's model under: its label, "slots_2_just_in_time"."""
    return re.sub(r"\W+", "_", mode)


def pinned(cpus: set[int] | None):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def run_clients(server: ManagedProcess, base: str, model: str, sets: list[tuple[int, int | None]], args, cpus,
                label: str) -> tuple[list[dict], float]:
    """One closed-loop test: a client process per (clients, priority) set; returns their results
    and the mean executed batch (rows per run) inside the window."""

    def counts() -> tuple[int, int]:
        ensure_running(server, label)  # (else its stats call failed "Connection refused", naming nothing)
        return model_counts(base, model)

    start = time.monotonic() + 1.0  # every process is up by then
    url = f"{base}/v2/models/{model}/infer"
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "client", "--url", url,
                               "--clients", str(n), "--priority", str(priority or 0), "--start", repr(start),
                               "--warm", repr(args.warm), "--seconds", repr(args.seconds)],
                              stdout=subprocess.PIPE, preexec_fn=pinned(cpus))
             for n, priority in sets]
    try:
        time.sleep(max(start + args.warm - time.monotonic(), 0.0))
        before = counts()
        time.sleep(max(start + args.warm + args.seconds - time.monotonic(), 0.0))
        after = counts()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise BenchFailed(f"a client process failed ({proc.returncode})")
            results.append(json.loads(out))
    finally:  # (an interrupted run, or a failed one: the other clients stop too)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    runs = after[1] - before[1]
    return results, (after[0] - before[0]) / runs if runs else 0.0


def model_counts(base: str, model: str) -> tuple[int, int]:
    stats = json.loads(http(f"{base}/v2/models/{model}/stats"))["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def summarize(rounds: list[dict]) -> dict:
    """One mode over its rounds: latencies pooled, throughput = answers / window time."""
    out = {}
    for test, parts in (("priority", ("low", "high")), ("throughput", ("all",))):
        seconds = sum(r[test]["seconds"] for r in rounds)
        answered = 0
        for part in parts:
            lat = np.concatenate([np.asarray(r[test][part]["latencies"]) for r in rounds]) * 1000
            answered += len(lat)
            out[f"{test}_{part}"] = {"n": int(len(lat)),
                                     "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
                                     "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
                                     "errors": sum(r[test][part]["errors"] for r in rounds)}
        out[f"{test}_req_per_s"] = answered / seconds
        out[f"{test}_rounds_req_per_s"] = [sum(len(r[test][p]["latencies"]) for p in parts) / r[test]["seconds"]
                                           for r in rounds]
        out[f"{test}_mean_batch"] = float(np.mean([r[test]["mean_batch"] for r in rounds]))
    low, high = out["priority_low"]["p50_ms"], out["priority_high"]["p99_ms"]
    out["high_p99_over_low_p50"] = high / low if low and high else None
    out["rounds_high_p99_over_low_p50"] = [
        float(np.percentile(r["priority"]["high"]["latencies"], 99) / np.percentile(r["priority"]["low"]["latencies"], 50))
        if r["priority"]["high"]["latencies"] and r["priority"]["low"]["latencies"] else None for r in rounds]
    return out


def measure(args) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = {cpus[-1]} if len(cpus) >= 2 and not args.no_pin else None
    client_cpus = set(cpus[:-1]) if server_cpus else None
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    onnx_path = ensure_model("heavy")
    raw = RawOrt(onnx_path, threads=1, cpus=server_cpus or set(cpus))
    ms_per_row = {b: raw.seconds_per_batch(b) * 1000 / b for b in (1, 8)}
    del raw
    with tempfile.TemporaryDirectory(prefix="bench-priority-") as tmp:
        repo = os.path.join(tmp, "models")
        os.makedirs(repo)
        make_repository(repo, onnx_path, args.gears)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = ManagedProcess([sys.executable, "-m", "aclserve", "serve", "--models", repo, "--port", str(port), "--grpc-port", "0",
                                 "--model-control-mode", "none", "--log-level", "warning", "--cpu-threads", "1"],
                                os.path.join(tmp, "server.log"), cwd=ROOT, preexec_fn=pinned(server_cpus))
        try:
            wait_ready(server, base, 120)
            per_mode = {mode: [] for mode in MODES}
            for k in range(args.rounds):
                for mode in MODES:
                    print(f"round {k + 1}/{args.rounds}: {mode} ...", flush=True)
                    model = model_name(mode)
                    label = f"round {k + 1}: {mode}"
                    res, batch = run_clients(server, base, model, [(args.low, LOW), (args.high, HIGH)], args,
                                             client_cpus, f"{label}, priority clients")
                    priority = {"low": res[0], "high": res[1], "seconds": args.seconds, "mean_batch": batch}
                    res, batch = run_clients(server, base, model, [(args.throughput_clients, None)], args,
                                             client_cpus, f"{label}, {args.throughput_clients} clients")
                    per_mode[mode].append({"priority": priority, "throughput": {
                        "all": res[0], "seconds": args.seconds, "mean_batch": batch}})
        finally:
            server.close()
    return {"modes": {mode: summarize(rounds) for mode, rounds in per_mode.items()},
            "raw_ms_per_row": ms_per_row,
            "server_cpus": sorted(server_cpus) if server_cpus else "not pinned",
            "client_cpus": sorted(client_cpus) if client_cpus else "not pinned"}


def fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def mode_errors(m: dict) -> int:
    return m["priority_low"]["errors"] + m["priority_high"]["errors"] + m["throughput_all"]["errors"]


def failed(requests: int) -> str:
    return f"{requests:,} request{'' if requests == 1 else 's'} failed"


def verdict(met: bool, errors: int) -> str:
    """A target is not met by a configuration any of whose requests failed (they were left out of
    its latencies and req/s: PASS with errors, found by an independent tester)."""
    if errors:
        return f"FAIL: {failed(errors)}"
    return "PASS" if met else "FAIL"


def report(result: dict, args) -> int:
    """Print the table and the targets' verdicts; the number of requests that failed."""
    modes = result["modes"]
    cost = result["raw_ms_per_row"]
    print(f"\nheavy CNN (gears {args.gears}; raw ONNX Runtime, one thread, on the server core: "
          f"{cost[1]:.2f} ms per row at batch 1, {cost[8]:.2f} at batch 8), server on CPU "
          f"{result['server_cpus']}, clients on {result['client_cpus']}, {args.rounds} rounds x "
          f"{args.seconds:g} s per test\n")
    print(f"| config | {args.low} low + {args.high} high: low p50 / p99 ms | high p50 / p99 ms "
          f"| high p99 / low p50 | req/s | mean batch | {args.throughput_clients} clients: req/s | "
          "p50 ms | mean batch | errors |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, m in modes.items():
        low, high, all_ = m["priority_low"], m["priority_high"], m["throughput_all"]
        print(f"| {mode} | {fmt(low['p50_ms'])} / {fmt(low['p99_ms'])} | {fmt(high['p50_ms'])} / "
              f"{fmt(high['p99_ms'])} | {fmt(m['high_p99_over_low_p50'], '.2f')} | "
              f"{m['priority_req_per_s']:.0f} | {m['priority_mean_batch']:.2f} | {m['throughput_req_per_s']:.0f} | "
              f"{fmt(all_['p50_ms'])} | {m['throughput_mean_batch']:.2f} | {mode_errors(m)} |")
    before = modes[BEFORE]["throughput_req_per_s"]
    print()
    before_rounds = " ".join(f"{x:.0f}" for x in modes[BEFORE]["throughput_rounds_req_per_s"])
    for mode, m in modes.items():
        ratio, speed = m["high_p99_over_low_p50"], m["throughput_req_per_s"] / before if before else 0.0
        per_round = " ".join(fmt(x, ".2f") for x in m["rounds_high_p99_over_low_p50"])
        errors = mode_errors(m) + (mode_errors(modes[BEFORE]) if mode != BEFORE else 0)
        line = (f"{mode}: high p99 / low p50 = {fmt(ratio, '.2f')} (rounds {per_round}; target <= 0.5: "
                f"{verdict(ratio is not None and ratio <= 0.5, mode_errors(m))})")
        if mode != BEFORE:
            rounds = " ".join(f"{x:.0f}" for x in m["throughput_rounds_req_per_s"])
            line += (f"; req/s at {args.throughput_clients} clients = {speed:.3f} x that of {BEFORE} (target >= "
                     f"0.97: {verdict(speed >= 0.97, errors)}; rounds {rounds} vs {before_rounds})")
        print(line)
    print(f"\n{result['command']}: {result['elapsed_s']:.0f} s")
    return sum(mode_errors(m) for m in modes.values())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    args = parse_args(argv)
    return run_tool("bench_batching priority", lambda: run(args))


def parse_args(argv: list[str]) -> argparse.Namespace:
    # (a default run: 2 rounds x 3 configurations x 2 tests x (2 + 6) s, about 100 s, and the set-up)
    p = argparse.ArgumentParser(prog="bench_batching.py priority", description=__doc__.split("\n\n")[0]
                                + " A default run takes about 2 minutes.")
    p.add_argument("--seconds", type=positive_float, default=6.0,
                   help="measured window per test and round (default %(default)g)")
    p.add_argument("--warm", type=non_negative_float, default=2.0,
                   help="seconds before each window (default %(default)g)")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="alternations of the three configs (default %(default)s)")
    p.add_argument("--low", type=positive_int, default=24, help="clients at priority 3 (default %(default)s)")
    p.add_argument("--high", type=positive_int, default=3, help="clients at priority 1 (default %(default)s)")
    p.add_argument("--throughput-clients", type=positive_int, default=64,
                   help="clients of the throughput test, at the default level (default %(default)s)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the server and the clients (default: the server on the last CPU, the clients on "
                        "the others, when there are two or more)")
    p.add_argument("--gears", type=gears, default=GEARS,
                   help="batch sizes the model is compiled for (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return p.parse_args(argv)


def run(args) -> int:
    started = time.perf_counter()
    result = measure(args)
    result.update(elapsed_s=time.perf_counter() - started, command=" ".join(["python"] + sys.argv))
    return finish(result, args)


def finish(result: dict, args) -> int:
    """Report the run's figures (and write them with --json); its exit status: 1 when a request failed."""
    errors = report(result, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))
    if errors:
        print(f"\nFAIL: {failed(errors)} (see the errors column)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
