"""A stop signal while `aclserve serve` starts ends it as a stop at any other time does: one line
saying it came during start-up, what is loading or compiling stopped, exit status 0. Before, one
that came before the serve loop set its handlers (the imports, the config, the building of the
servers: 1-2 s) killed the process (SIGTERM: 143, nothing logged) or raised KeyboardInterrupt
wherever it was (SIGINT: 130, at times a traceback). Real `python -m aclserve serve` processes;
a start-up is held where it is by what it waits for (its config from a pipe, a compile's child
held by ACLSERVE_COMPILE_HOLD), never timed."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from tests import REPO
from tests.processes import leashed_popen, run_as_group
from tests.serving import free_port
from tests.tiny_models import double_onnx

HANG_GUARD_S = 60
DURING_START_UP = "received during start-up: shutting down"


@contextlib.contextmanager
def serve(tmp_path, models, *flags) -> Iterator[subprocess.Popen]:
    """`python -m aclserve serve` of `models` on any free port, gRPC off; its output in `proc.log`;
    killed on the way out if still running."""
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port", "0",
                              "--grpc-port", "0", "--device", "cpu", "--log-level", "info", *flags],
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=out,
                             stderr=subprocess.STDOUT, preexec_fn=hangup_not_ignored)
    proc.log = log
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def hangup_not_ignored() -> None:
    """(A test run under nohup, or by a runner that ignores SIGHUP, would hand that on: the server
    then keeps ignoring it, as asked.)"""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def open_for_writing(fifo, proc: subprocess.Popen) -> int:
    """The write end of `fifo`, once `proc` has opened it to read (a hang guard while it has not)."""
    for _ in range(HANG_GUARD_S * 50):
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            assert proc.poll() is None, proc.log.read_text()
            time.sleep(0.02)
    raise AssertionError("the server never opened its config")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda sig: sig.name)
def test_a_stop_signal_while_the_server_reads_its_config_ends_the_start_up_with_status_0(tmp_path, sig):
    """The process waits for its config from a pipe (a supported config: config/files.py
    read_yaml), long before the serve loop's handlers: the signal comes then, the config after."""
    fifo = tmp_path / "serve.yaml"
    os.mkfifo(fifo)
    (tmp_path / "models").mkdir()
    with serve(tmp_path, tmp_path / "models", "--config", str(fifo)) as proc:
        writer = open_for_writing(fifo, proc)  # the server is in its open() or read() of the config
        try:
            proc.send_signal(sig)
            os.set_blocking(writer, True)
            os.write(writer, b"shutdown_timeout_s: 5\n")
        except BrokenPipeError:  # (the signal killed it: its status says so below)
            pass
        finally:
            os.close(writer)
        status = proc.wait(HANG_GUARD_S)
    out = proc.log.read_text()
    assert status == 0, out
    assert f"{sig.name} {DURING_START_UP}" in out and "Traceback" not in out, out
    assert "listening" not in out and "runtime" not in out, out  # nothing was started that it would stop


def test_sigterm_while_a_model_compiles_at_start_up_stops_the_compile_and_exits_0(tmp_path, compile_holds):
    """The start's first compile held in its child process: SIGTERM says it came during start-up,
    stops the compile (its process gone) as a shutdown does, and the server exits 0."""
    models = tmp_path / "models"
    models.mkdir()
    double_onnx(models / "m.onnx")
    os.utime(models / "m.onnx", (time.time() - 3600,) * 2)  # settled: the start's first scan takes it
    with serve(tmp_path, models) as proc:
        for _ in range(HANG_GUARD_S * 50):  # until the compile's child holds
            if any(compile_holds.iterdir()) or proc.poll() is not None:
                break
            time.sleep(0.02)
        child = int(next(compile_holds.iterdir()).name)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(HANG_GUARD_S)
    out = proc.log.read_text()
    assert status == 0, out
    assert f"SIGTERM {DURING_START_UP}" in out, out
    assert "m: the compile of version 1 was stopped (the server is shutting down)" in out, out
    assert not running(child), out


# A server process whose SIGTERM comes once its loop runs, before `serve` has set its handlers
# (what building the runtime, the app and the gRPC server takes): uvloop, which has the signals
# written to its own pipe from its start, hands that one to serve's handler too, once set.
IN_THE_LOOP = """
import os, signal, sys
from aclserve import logs, startup_signals
from aclserve.app import serve
from aclserve.cli.serve import _run
from aclserve.config import load_server_config
logs.configure("info")
config = load_server_config(None, {"models_dir": sys.argv[1], "port": 0, "grpc_port": int(sys.argv[2]),
                                   "device": "cpu"})
startup_signals.record()

async def starting():
    os.kill(os.getpid(), signal.SIGTERM)
    return await serve(config)

status = _run(starting())
logs.stop_queue()
sys.exit(status)
"""


def test_sigterm_once_the_loop_runs_but_before_its_handlers_ends_the_start_up_once(tmp_path, models_dir):
    # (run_as_group: a server that did not stop dies with the test, killed by the kernel should pytest end first)
    proc = run_as_group([sys.executable, "-c", IN_THE_LOOP, str(models_dir), str(free_port())],
                        timeout=HANG_GUARD_S, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(DURING_START_UP) == 1, proc.stderr  # (not "received again: the drain ends now")
    assert "listening" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie that no one has reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
