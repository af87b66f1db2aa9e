"""ATC's work folder beside the output (`.atc-*`, aclserve/om/atc.py): one left by a compile
killed outright (its process's SIGKILL: the out-of-memory killer's, or `kill -9` of it and of
`aclserve compile`; `kill -9` of `aclserve compile` alone has its compile's process remove it)
is removed by the next ATC compile into that folder, while a live compile's folder, and one
without the lock (an older aclserve's), are left alone. It stayed for ever."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from tests import REPO

from .atc_stand_in import alive

HANG_GUARD_S = 120  # (not a timing: how long a wait may last before the test says it hung)


def _compile(model: str, out, record, mode: str) -> subprocess.Popen:
    """`aclserve compile` with the stand-in ATC in `mode`, recording into `record`."""
    env = {**os.environ, "FAKE_ATC_RECORD": str(record), "FAKE_ATC_MODE": mode, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "aclserve", "compile", model, "-o", out, "--soc-version",
                             "Ascend310P3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _until_atc_runs(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        if "ATC start working" in line:
            return
    raise AssertionError(f"ATC never ran: {proc.communicate(timeout=HANG_GUARD_S)}")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _open_files(pid: int) -> set[str]:
    folder = f"/proc/{pid}/fd"
    return {os.readlink(f"{folder}/{fd}") for fd in os.listdir(folder)}


def _until_gone(*pids: int) -> None:
    for _ in range(HANG_GUARD_S * 100):
        if not any(map(alive, pids)):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"still running: {[p for p in pids if alive(p)]}")


def _work_folders(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".atc-"))


def test_a_killed_compiles_atc_folder_goes_with_the_next_compile_a_live_ones_stays(tmp_path, fake_atc,
                                                                                   multi_io_onnx, monkeypatch):
    atc, _ = fake_atc
    monkeypatch.setenv("PATH", f"{atc.parent}:{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()
    killed, live = _compile(multi_io_onnx, out / "a.om", tmp_path / "a.json", "sleep"), None
    try:
        _until_atc_runs(killed)
        atc_pid = json.loads((tmp_path / "a.json").read_text())["pid"]
        leash = _parent(atc_pid)
        build = _parent(leash)  # the compile's process, running the build: `aclserve compile`'s child
        killed_folder = _work_folders(out)
        assert len(killed_folder) == 1
        lock = str(out / killed_folder[0] / ".lock")
        assert lock in _open_files(build) and lock in _open_files(leash)  # (held until ATC is gone)
        assert lock not in _open_files(atc_pid)
        os.kill(build, signal.SIGKILL)
        killed.kill()
        killed.communicate(timeout=HANG_GUARD_S)
        _until_gone(build, leash, atc_pid)  # (ATC dies with its leash's starter: atc_leash.py)
        assert _work_folders(out) == killed_folder  # left: nothing ran to remove it
        live = _compile(multi_io_onnx, out / "b.om", tmp_path / "b.json", "sleep")
        _until_atc_runs(live)
        live_folder = _work_folders(out)
        assert len(live_folder) == 1 and live_folder != killed_folder  # the killed one's went with it
        older = out / ".atc-older"  # (no lock: nothing tells whether its compile runs)
        older.mkdir()
        done = _compile(multi_io_onnx, out / "c.om", tmp_path / "c.json", "ok")
        said, err = done.communicate(timeout=HANG_GUARD_S)
        assert done.returncode == 0, (said, err)
        assert _work_folders(out) == sorted([older.name, *live_folder])  # a live compile's is left alone
        live.send_signal(signal.SIGTERM)  # (it removes its own, as ever)
        _, err = live.communicate(timeout=HANG_GUARD_S)
        assert live.returncode == 128 + signal.SIGTERM, err
        assert sorted(p.name for p in out.iterdir()) == [older.name, "c.om"]
    finally:
        for proc, record in ((killed, "a.json"), (live, "b.json")):
            if proc is None:
                continue
            proc.kill()
            proc.communicate(timeout=HANG_GUARD_S)
            if (tmp_path / record).exists() and alive(pid := json.loads((tmp_path / record).read_text())["pid"]):
                os.kill(pid, signal.SIGKILL)
