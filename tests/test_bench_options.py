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
in tracebacks, `--seconds 0` or `-1` ran, and `--chart` without `--idle` was ignored after a run;
`bench_server --server-cpus 7` on a machine without a CPU 7 failed in taskset after the models were
built, `bench_batching --cpu 9` said "[Errno 22] Invalid argument", `bench_batching priority --gears
0` failed in aclserve's compile with a CalledProcessError quoting the command, `soak --minutes 0`
ran no load, `--clients -3` handed the server a YAML it refused, `--reload-s 0` wrote 25,725 swaps
in 6 s and passed, `--fault-probability 5` was refused by the server, reported as its death,
`bench_decoders --size 0` printed an empty table and exited 0)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import attack_server  # noqa: E402
import bench_batching  # noqa: E402
import bench_decoders  # noqa: E402
import bench_images  # noqa: E402
import bench_overload  # noqa: E402
import bench_priority  # noqa: E402
import bench_runtime  # noqa: E402
import bench_server  # noqa: E402
import grpc_slow_senders  # noqa: E402
import install_perf_analyzer  # noqa: E402
import loop_stalls  # noqa: E402
import reload_rss  # noqa: E402
import soak  # noqa: E402

ONE_WORKLOAD = ["--workloads", "light-json"]  # (no gRPC workload: no look for perf_analyzer)
NO_SUCH_CPU = str(max(os.sched_getaffinity(0)) + 1)  # (one this process may not use)


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
    (bench_server, ["--server-cpus", NO_SUCH_CPU], "--server-cpus"),
    (bench_server, ["--client-cpus", f"0-{NO_SUCH_CPU}"], "--client-cpus"),
    (bench_overload, ["--server-cpus", NO_SUCH_CPU], "--server-cpus"),
    (bench_batching, ["--cpu", NO_SUCH_CPU], "--cpu"),
    (bench_batching, ["--cpu", "-2"], "--cpu"),
    (bench_priority, ["--gears", "0"], "--gears"),
    (bench_priority, ["--gears", "abc"], "--gears"),
    (bench_priority, ["--gears", "4,2"], "--gears"),
    (soak, ["--minutes", "0"], "--minutes"),
    (soak, ["--minutes", "nan"], "--minutes"),
    (soak, ["--clients", "-3"], "--clients"),
    (soak, ["--reload-s", "0"], "--reload-s"),
    (soak, ["--reload-s", "0.5"], "--reload-s"),
    (soak, ["--fault-probability", "5"], "--fault-probability"),
    (soak, ["--slow", "-1"], "--slow"),
    (soak, ["--timeout-s", "0"], "--timeout-s"),
    (bench_decoders, ["--size", "0"], "--size"),
    (bench_decoders, ["--size", "-5"], "--size"),
    (bench_decoders, ["--seconds", "-1"], "--seconds"),
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


def test_the_cpus_and_gears_a_run_can_use_are_taken():
    cpu = str(min(os.sched_getaffinity(0)))
    assert bench_server.parse_args(["--server-cpus", cpu] + ONE_WORKLOAD).server_cpus == cpu
    assert bench_batching.parse_args(["--cpu", cpu]).cpu == int(cpu)
    assert bench_batching.parse_args(["--cpu", "-1"]).cpu is None  # (not pinned)
    assert bench_priority.parse_args(["--gears", "1, 2,4"]).gears == "1,2,4"
    assert soak.parse_args(["--reload-s", "1", "--fault-probability", "0"]).reload_s == 1


def test_install_perf_analyzer_takes_one_folder_and_no_option_it_does_not_know(monkeypatch, tmp_path, capsys):
    """Its arguments were read by hand: `--bogus` installed into ./--bogus, and further arguments
    were ignored."""
    installed = []
    monkeypatch.setattr(install_perf_analyzer, "install", installed.append)  # (nothing downloaded)
    for argv in (["--bogus"], [str(tmp_path), "extra"]):
        with pytest.raises(SystemExit) as ended:
            install_perf_analyzer.main(argv)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "error: unrecognized arguments: " in err and "Traceback" not in err, err
    assert installed == []
    assert install_perf_analyzer.main([str(tmp_path / "pa")]) == 0
    assert installed == [str(tmp_path / "pa")]


@pytest.mark.parametrize("tool, options", [
    ("bench_server.py", ONE_WORKLOAD + ["--models-src", "{tmp}"]),
    ("bench_overload.py", ["--models-src", "{tmp}"]),
    ("bench_trace.py", []),
    ("bench_images.py", ["--models-dir", "{tmp}"]),
])
def test_without_wrk_the_run_ends_before_it_starts_saying_how_to_get_it(tool, options, tmp_path):
    """Without wrk on PATH, bench_server said "[Errno 2] No such file or directory: 'wrk'",
    and bench_overload, bench_trace and bench_images "wrk failed (127): taskset: failed to
    execute wrk", once their server had started (a tester, t80)."""
    path = tmp_path / "bin"
    path.mkdir()
    if shutil.which("taskset"):
        (path / "taskset").symlink_to(shutil.which("taskset"))  # (wrk alone is missing)
    argv = [sys.executable, os.path.join(REPO, "tools", tool), *(o.format(tmp=tmp_path) for o in options)]
    done = subprocess.run(argv, env=dict(os.environ, PATH=str(path), PYTHONPATH=str(REPO), TMPDIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=120)
    name = tool.removesuffix(".py")
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(fr"{name}: error: wrk (and taskset )?(is|are) not on PATH: .*apt-get install wrk.*\n",
                        done.stderr), done.stderr
    assert sorted(os.listdir(tmp_path)) == ["bin"], "it built or started something first"
