"""The benchmark tools refuse options they cannot run in argparse's one line, exit status 2 (an
independent tester: `bench_server --conc abc` or `--server-cpus x`, `bench_overload --conc abc`
or `--open-loads x`, `bench_batching --rounds 0`, `--loads abc` or `--seconds 0` ended in
tracebacks, some after the models were built; `bench_server --duration -1` or `0` ran 1 s windows
under a header saying `windows: -1 s measured`, and a fractional duration was rounded up for wrk
without a word)."""
from __future__ import annotations

import os
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_batching  # noqa: E402
import bench_overload  # noqa: E402
import bench_server  # noqa: E402

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
]


@pytest.mark.parametrize("tool, argv, option", BAD, ids=[f"{tool.__name__} {' '.join(argv)}" for tool, argv, _ in BAD])
def test_an_option_it_cannot_run_is_one_usage_line(tool, argv, option, capsys):
    with pytest.raises(SystemExit) as ended:
        tool.parse_args(argv + (ONE_WORKLOAD if tool is bench_server else []))
    err = capsys.readouterr().err
    assert ended.value.code == 2 and f"error: argument {option}: " in err, err
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
