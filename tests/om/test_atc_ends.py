"""How an ATC build ends, with a stand-in `atc` (real ATC cannot be installed here): its timeout
kills it, a process that exits abandoning it takes it along, `aclserve compile` ended by SIGTERM
or SIGHUP, or killed outright, ends its ATC and leaves nothing, a compile under nohup keeps
running when the terminal closes, and an ATC killed by a signal is reported so with its lines, the
signal named, and `aclserve compile` exits 128 + it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aclserve.om.atc import AtcFailed, run_streaming as atc_run_streaming
from aclserve.om.compile import compile_model

from .atc_stand_in import alive, leftovers


def test_timeout_kills_atc_and_leaves_nothing(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")
    with pytest.raises(AtcFailed, match="timed out after 2 s"):
        compile_model(multi_io_onnx, tmp_path / "t.om", batch="1", soc_version="Ascend310P3", atc=str(atc), timeout=2,
                      log=lambda s: None)
    if record.exists():  # on a very slow machine the stand-in may not even have started
        with pytest.raises(ProcessLookupError):
            os.kill(json.loads(record.read_text())["pid"], 0)
    assert not (tmp_path / "t.om").exists() and leftovers(tmp_path) == []


ABANDONED_BUILD = """
import sys, threading
from aclserve.om.compile import compile_model
onnx, out, atc = sys.argv[1:]
started = threading.Event()  # the stand-in's first line: its record is written
log = lambda line: started.set() if "ATC start working" in line else None
threading.Thread(target=compile_model, args=(onnx, out), daemon=True, kwargs=dict(
    batch="1", soc_version="Ascend310P3", atc=atc, timeout=600, log=log)).start()
assert started.wait(60)
"""


def test_a_build_abandoned_at_exit_is_killed_and_its_work_folder_removed(tmp_path, fake_atc, multi_io_onnx,
                                                                         monkeypatch):
    """A server shut down during a compile abandons its load thread: the process exits, and the
    ATC it started (in its own session) must not run on for up to its timeout."""
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([sys.executable, "-c", ABANDONED_BUILD, multi_io_onnx, out / "a.om", atc],
                   check=True, timeout=120)
    pid = json.loads(record.read_text())["pid"]
    try:
        for _ in range(500):
            if not alive(pid):
                break
            threading.Event().wait(0.01)
        assert not alive(pid) and leftovers(out) == [] and not (out / "a.om").exists()
    finally:
        if alive(pid):
            os.kill(pid, 9)


@pytest.fixture
def compile_until_atc_runs(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    """start(mode, **popen_args) -> (process, output folder): `aclserve compile` with the stand-in
    acting per FAKE_ATC_MODE `mode`, returned once ATC runs (a hang guard: the stand-in sleeps
    600 s, the caller's communicate() timeout). Whatever is left at the end is killed: the
    compile, its ATC and the process ATC started."""
    atc, record = fake_atc
    monkeypatch.setenv("PATH", f"{atc.parent}:/usr/bin:/bin")
    out = tmp_path / "out"
    out.mkdir()
    started = []

    def start(mode: str, **popen_args) -> tuple[subprocess.Popen, Path]:
        monkeypatch.setenv("FAKE_ATC_MODE", mode)
        proc = subprocess.Popen([sys.executable, "-m", "aclserve", "compile", multi_io_onnx, "-o", out / "s.om",
                                 "--soc-version", "Ascend310P3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **popen_args)
        started.append(proc)
        for line in proc.stdout:
            if "ATC start working" in line:
                break
        return proc, out
    yield start
    for proc in started:
        proc.kill()
    ran = json.loads(record.read_text()) if record.exists() else {}
    for pid in (ran.get("pid"), ran.get("helper")):
        if pid and alive(pid):
            os.kill(pid, 9)


@pytest.mark.parametrize("signum", [15, 1])
def test_a_compile_ended_by_sigterm_or_sighup_leaves_nothing(fake_atc, compile_until_atc_runs, signum):
    """`kill` (or a closed terminal) in the middle of an ATC build: ended as a Ctrl-C is, exit 128
    + the signal; the ATC it started (in its own session) killed and its work folder removed. The
    signal's default action left both (and a CPU compile's partial .om)."""
    _, record = fake_atc
    proc, out = compile_until_atc_runs("sleep")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    pid = json.loads(record.read_text())["pid"]
    for _ in range(500):
        if not alive(pid):
            break
        threading.Event().wait(0.01)
    assert proc.returncode == 128 + signum and "Traceback" not in err, err
    assert not alive(pid) and leftovers(out) == [] and not (out / "s.om").exists()


def test_a_compile_killed_outright_takes_its_atc_with_it(fake_atc, compile_until_atc_runs):
    """`kill -9` of `aclserve compile` runs none of its clean-up: its ATC, in a session of its own,
    ran on until its timeout (an hour by default), its own processes too (its folder: test_atc_work_folder)."""
    _, record = fake_atc
    proc, _ = compile_until_atc_runs("sleep_with_helper")
    ran = json.loads(record.read_text())
    proc.kill()
    proc.communicate(timeout=120)
    for _ in range(3000):  # (a hang guard: the kernel's signal is at once)
        if not alive(ran["pid"]) and not alive(ran["helper"]):
            break
        threading.Event().wait(0.01)
    assert not alive(ran["pid"]) and not alive(ran["helper"])


def test_a_compile_under_nohup_keeps_running_when_the_terminal_closes(compile_until_atc_runs):
    """SIGHUP ignored as the process starts (nohup) stays ignored: the handler that ends a
    compile cleanly on SIGHUP ended this one, the long build nohup was there to keep."""
    proc, out = compile_until_atc_runs("sleep", preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGTERM)  # (delivered after the SIGHUP: the exit says which ended it)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert leftovers(out) == []


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_an_atc_killed_by_a_signal_is_reported_so_with_its_lines(tmp_path, sig):
    """The leash ends as ATC did: killed by the same signal. For SIGKILL (the out-of-memory
    killer, the leash's own end_atc) it raised instead, resetting SIGKILL's handler, and the
    compile failed "exit status 1" with the leash's traceback as ATC's output."""
    script = f"echo hi; kill -{sig} $$"
    with pytest.raises(AtcFailed) as failed:
        atc_run_streaming(["sh", "-c", script], cwd=str(tmp_path), timeout=60, log=lambda line: None)
    text, signum = str(failed.value), int(getattr(signal, "SIG" + sig))
    assert text.startswith(f"ATC was killed by SIG{sig} (signal {signum}") and "hi" in text, text
    assert failed.value.signum == signum  # (AtcKilled: `aclserve compile` exits 128 + it)
    assert "Traceback" not in text and "OSError" not in text, text


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_atc_killed_by_a_signal_is_said_with_its_signal_and_exit_status(fake_atc, compile_until_atc_runs, signum):
    """ATC alone killed (the kernel's out-of-memory killer picks the compile's largest process):
    one line naming the signal, exit 128 + it as for the compile's own process killed; it was
    "ATC failed (exit status -9)", exit 1, ATC's verdict on the model."""
    _, record = fake_atc
    proc, out = compile_until_atc_runs("sleep")
    os.kill(json.loads(record.read_text())["pid"], signum)
    _, err = proc.communicate(timeout=120)
    why = "; the kernel's out-of-memory killer sends it when the host runs short of memory" \
        if signum == signal.SIGKILL else ""
    assert (proc.returncode, err) == (128 + signum, (
        f"aclserve compile: error: ATC was killed by {signal.Signals(signum).name} (signal {int(signum)}{why}): "
        "ATC start working now, please wait for a moment.\n")), err
    assert leftovers(out) == [] and not (out / "s.om").exists()
