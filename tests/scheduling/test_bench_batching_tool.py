"""tools/bench_batching.py runs a fresh batcher per window on one pool, which takes one listener at
a time: each window's batcher lets the pool go when it is done, so the next window can start
(the second window failed with "the pool has its listener already")."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

import pytest

from aclserve.runtime import open_pool
from aclserve.scheduling import BatchingConfig, QueuePolicy

from tests import REPO
from tests.tiny_models import affine_onnx, affine_request, compile_cpu_om

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_batching  # noqa: E402
from bench_run import BenchFailed  # noqa: E402


def test_windows_one_after_another_share_the_pool(runtime, tmp_path):
    om = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", "1,2,4")
    pool = open_pool(runtime, om, "affine", slots=2)
    sample = affine_request(1)

    async def windows():
        on, off = BatchingConfig(enabled=True), BatchingConfig(enabled=False)
        closed = [await bench_batching.closed_loop(pool, sample, config, 4, 0.05, 0.2) for config in (on, off)]
        opened = await bench_batching.open_loop(pool, sample, on, 200.0, 0.2, 0.1, None, 30.0, 0)
        return closed, opened

    try:
        closed, opened = asyncio.run(windows())
    finally:
        pool.close()
    assert [window["errors"] for window in closed] == [0, 0]
    assert all(window["done"] > 0 for window in closed)
    assert opened["completed"] > 0


def test_help_lists_the_modes_and_the_labels_are_the_readmes():
    """`bench_batching.py --help` did not mention the `priority` mode README runs, and that mode
    printed its configurations as default / jit / eager where README's table names them by what
    they set (an independent tester, t56): --help lists both modes, and each row of README's
    table is named by the label the tool prints."""
    import re
    import subprocess

    import bench_priority

    shown = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_batching.py"), "--help"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "bench_batching.py priority [options]" in shown.stdout, shown.stdout
    assert " / ".join(bench_priority.MODES) in " ".join(shown.stdout.split()), shown.stdout
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        section = f.read().split("**Priority under saturation**", 1)[1]
    table = section[section.index("\n| config |"):].split("\n\n", 1)[0]
    named = [re.match(r"\| `([^`]+)`", row).group(1) for row in table.splitlines()[3:]]
    assert named == list(bench_priority.MODES), named


def test_a_full_queue_lets_the_batcher_run_and_fails_the_run(runtime, tmp_path):
    """More submitters than the queue holds (`--max-queue 48`, 64 submitters): QueueFull comes
    before infer awaits anything, and the submitter asked again at once, so the refused ones kept
    the event loop and no batch ran (0 req/s, then a ZeroDivisionError; an independent tester).
    Now a refusal yields, as `aclserve profile`'s closed loop does (bench_batching uses it), the
    refusals are counted by why, and they fail the run."""
    om = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", "1,2,4")
    pool = open_pool(runtime, om, "affine", slots=2)
    config = BatchingConfig(enabled=True, default_queue_policy=QueuePolicy(max_queue_size=2))
    try:
        window = asyncio.run(bench_batching.closed_loop(pool, affine_request(1), config, 16, 0.05, 0.3))
    finally:
        pool.close()
    assert window["done"] > 0, window
    assert window["errors"] > 0 and window["refused"] == {"QueueFull": window["errors"]}, window
    closed = bench_batching.merge_closed([window])
    check = bench_batching.errors_check({"capacity": closed, "batching_off": closed, "open_loop": []})
    assert not check["ok"] and check["verdict"] == "FAIL", check
    assert f"batching on {window['errors']:,} (QueueFull)" in check["detail"], check


def test_a_closed_loop_that_completes_nothing_ends_the_run_in_one_line(runtime, tmp_path, clean_faults):
    """Its req/s is the base of the open loop's rates: 0 ended in a ZeroDivisionError traceback."""
    from aclserve.acl.cpu import faults

    om = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", "1,2,4")
    pool = open_pool(runtime, om, "affine", slots=2)
    args = argparse.Namespace(delay_ms=1.0, max_queue=0, capacity_seconds=0.2, rounds=1, concurrency=4, warm=0.05,
                              loads="0.8", seconds=0.2, high=0.1, timeout_ms=0.0, drain_timeout=30.0, seed=0)
    faults.inject("execute")  # every batch fails
    try:
        with pytest.raises(BenchFailed, match="with batching on completed no request in its windows"):
            asyncio.run(bench_batching.run(args, pool))
    finally:
        pool.close()


def test_a_model_the_runtime_cannot_load_ends_the_run_in_one_line(runtime, tmp_path, capsys):
    """run_tool took every RuntimeError as a failure's one line, a bug's (NotImplementedError) too;
    bench_batching names the runtime's errors (its LoadError, AclError, ServeError, CompileError)
    as its measurement's failures instead."""
    from bench_run import run_tool

    bad = tmp_path / "affine.om"
    bad.write_bytes(b"not an om")
    assert run_tool("bench_batching", lambda: open_pool(runtime, str(bad), "affine"), bench_batching.MEASURED) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench_batching: error: ") and err.count("\n") == 1 and "Traceback" not in err, err


def priority_result(default_errors: int) -> dict:
    """What `bench_batching priority` measured, one round: the default configuration meets both
    targets, with `default_errors` failed requests among its high-priority clients."""
    import bench_priority

    def one_round(low_ms: float, high_ms: float, errors: int = 0) -> dict:
        def clients(ms, failed=0):
            return {"latencies": [ms / 1000] * 20, "errors": failed}
        return {"priority": {"low": clients(low_ms), "high": clients(high_ms, errors), "seconds": 1.0,
                             "mean_batch": 3.0},
                "throughput": {"all": clients(80.0), "seconds": 1.0, "mean_batch": 8.0}}
    rounds = {"default": one_round(230.0, 29.0, default_errors), "slots: 2, just_in_time": one_round(150.0, 120.0),
              "slots: 2, when_slot_free": one_round(150.0, 190.0)}
    return {"modes": {mode: bench_priority.summarize([rounds[mode]]) for mode in bench_priority.MODES},
            "raw_ms_per_row": {1: 2.75, 8: 2.73}, "server_cpus": [1], "client_cpus": [0],
            "command": "python tools/bench_batching.py priority", "elapsed_s": 20.0}


def test_priority_errors_fail_the_targets_and_the_exit_status(capsys):
    """With request errors (ACLSERVE_CPU_FAULTS='execute:probability=0.02') `bench_batching
    priority` printed PASS and exited 0 (an independent tester): the failed requests were left
    out of the latencies and req/s the targets judge."""
    import bench_priority

    args = argparse.Namespace(gears="1,2,4,8", rounds=1, seconds=1.0, low=24, high=3, throughput_clients=64,
                              json=None)
    assert bench_priority.finish(priority_result(0), args) == 0
    clean = capsys.readouterr().out
    assert "default: high p99 / low p50 = 0.13 (rounds 0.13; target <= 0.5: PASS)" in clean, clean
    assert bench_priority.finish(priority_result(1), args) == 1
    printed = capsys.readouterr()
    default = next(line for line in printed.out.splitlines() if line.startswith("default:"))
    assert "PASS" not in default and default.count("FAIL: 1 request failed") == 2, default
    assert "FAIL: 1 request failed (see the errors column)" in printed.err, printed.err
