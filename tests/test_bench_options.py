"""The benchmark tools refuse options they cannot run in argparse's one line, exit status 2 (an
independent tester: `bench_server --conc abc` or `--server-cpus x`, `bench_overload --conc abc`
or `--open-loads x`, `bench_batching --rounds 0`, `--loads abc` or `--seconds 0` ended in
tracebacks, some after the models were built; `bench_server --duration -1` or `0` ran 1 s windows
under a header saying `windows: -1 s measured`, and a fractional duration was rounded up for wrk
without a word; `loop_stalls --cases` of a misspelt name measured nothing and printed an empty
table, `attack_server --attacks` started its server first, `bench_images --rounds 0` or
`--workers 0` ended in a traceback after the models were built, `grpc_slow_senders --stall-kb` of
the whole message sent none of it; t80: `reload_rss --reloads 0` ended in an IndexError,
`--clients 0` or `-2` ran with no load and exited 0, `bench_runtime --gears x`, `0` or `--threads 0`
in tracebacks, `--seconds 0` or `-1` ran, and `--chart` without `--idle` was ignored after a run)."""
from __future__ import annotations

import os
import re
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import attack_server  # noqa: E402
import bench_batching  # noqa: E402
import bench_images  # noqa: E402
import bench_overload  # noqa: E402
import bench_runtime  # noqa: E402
import bench_server  # noqa: E402
import grpc_slow_senders  # noqa: E402
import loop_stalls  # noqa: E402
import reload_rss  # noqa: E402

ONE_WORKLOAD = ["--workloads", "light-json"]  # (no gRPC workload: no look for perf_analyzer)


BAD = [
    (bench_server, ["--conc", "abc"], "--conc"),
    (bench_server, ["--conc", "16,0"], "--conc"),
    (bench_server, ["--server-cpus", "x"], "--server-cpus"),
    (bench_server, ["--client-cpus", "1-0"], "--client-cpus"),
    (bench_server, ["--duration", "-1"], "--duration"),
    (bench_server, ["--duration", "0"], "--duration"),
    (bench_server, ["--warmup", "-1"], "--warmup"),
    (bench_overload, ["--conc", "abc"], "--conc"),
    (bench_overload, ["--open-loads", "x"], "--open-loads"),
    (bench_overload, ["--duration", "0"], "--duration"),
    (bench_batching, ["--rounds", "0"], "--rounds"),
    (bench_batching, ["--loads", "abc"], "--loads"),
    (bench_batching, ["--seconds", "0"], "--seconds"),
    (bench_batching, ["--max-queue", "-1"], "--max-queue"),
    (bench_images, ["--rounds", "0"], "--rounds"),
    (bench_images, ["--workers", "0"], "--workers"),
    (bench_images, ["--clients", "0"], "--clients"),
    (attack_server, ["--attacks", "gzip,slowlaris"], "--attacks"),
    (attack_server, ["--count", "0"], "--count"),
    (attack_server, ["--hold-s", "-1"], "--hold-s"),
    (loop_stalls, ["--cases", "json-keys,jpeg"], "--cases"),
    (loop_stalls, ["--mb", "0"], "--mb"),
    (grpc_slow_senders, ["--senders", "0"], "--senders"),
    (grpc_slow_senders, ["--message-mb", "1", "--stall-kb", "1024"], "--stall-kb"),
    (reload_rss, ["--reloads", "0"], "--reloads"),
    (reload_rss, ["--clients", "0"], "--clients"),
    (reload_rss, ["--clients", "-2"], "--clients"),
    (bench_runtime, ["--gears", "x"], "--gears"),
    (bench_runtime, ["--gears", "0"], "--gears"),
    (bench_runtime, ["--gears", "8,1"], "--gears"),
    (bench_runtime, ["--gears", "4,4"], "--gears"),
    (bench_runtime, ["--threads", "0"], "--threads"),
    (bench_runtime, ["--seconds", "0"], "--seconds"),
    (bench_runtime, ["--seconds", "-1"], "--seconds"),
    (bench_runtime, ["--chart", "x.png"], "--chart"),  # (the runtime table has none: a minute's run, no chart)
]


@pytest.mark.parametrize("tool, argv, option", BAD, ids=[f"{tool.__name__} {' '.join(argv)}" for tool, argv, _ in BAD])
def test_an_option_it_cannot_run_is_one_usage_line(tool, argv, option, capsys):
    with pytest.raises(SystemExit) as ended:
        tool.parse_args(argv + (ONE_WORKLOAD if tool is bench_server else []))
    err = capsys.readouterr().err
    assert ended.value.code == 2 and re.search(f"error: (argument )?{option}[: ]", err), err
    assert "Traceback" not in err, err


def test_wrk_windows_are_whole_seconds_and_help_says_so(capsys):
    """wrk takes whole seconds: a fraction is rounded up where the option is read, so the header
    the run prints says the windows it measures, and --help says so."""
    args = bench_server.parse_args(["--duration", "2.5", "--warmup", "0.5"] + ONE_WORKLOAD)
    assert (args.duration, args.warmup) == (3, 1)
    assert bench_server.parse_args(["--warmup", "0"] + ONE_WORKLOAD).warmup == 0  # (none)
    assert bench_overload.parse_args(["--duration", "1.2", "--open-loads", ""]).duration == 2
    for parse in (bench_server.parse_args, bench_overload.parse_args):
        with pytest.raises(SystemExit):
            parse(["--help"])
        shown = " ".join(capsys.readouterr().out.split())
        assert "whole seconds, as wrk takes them: a fraction is rounded up" in shown, shown


def test_an_empty_list_of_overload_windows_is_none_as_readme_runs_it():
    """README's `bench_overload.py --settings default --conc '' --open-loads 4`: no closed-loop
    overload window, only the capacity one."""
    skipped = bench_overload.parse_args(["--conc", "", "--open-loads", ""])
    assert (skipped.conc, skipped.open_loads) == ([], [])
