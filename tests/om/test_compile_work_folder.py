"""The CPU compile's work folder in the temp folder (aclserve/om/work_folder.py): one left by a
compile killed outright (the out-of-memory killer's SIGKILL) is removed by the next compile of
any process sharing the temp folder, while a live compile's folder, and one without the lock
(an older aclserve's), are left alone. It stayed for ever before (114 MB of optimised model)."""
from __future__ import annotations

import signal
import subprocess
import sys
import tempfile

import pytest

from aclserve.om.work_folder import PREFIX

from tests.tiny_models import affine_onnx, compile_cpu_om

# a compile's process inside its work folder, writing what the optimiser would, then waiting
COMPILING = ("import sys, time; from aclserve.om.work_folder import work_folder\n"
             "with work_folder() as folder:\n"
             "    open(folder + '/optimised.onnx', 'wb').write(b'x' * 1000)\n"
             "    print(folder, flush=True)\n"
             "    time.sleep(600)\n")


@pytest.fixture
def temp_folder(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read again from TMPDIR)
    return folder


def compiling() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", COMPILING], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_a_killed_compiles_folder_goes_with_the_next_compile_a_live_ones_stays(temp_folder, tmp_path):
    killed, killed_folder = compiling()
    live, live_folder = compiling()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
        older = temp_folder / f"{PREFIX}older"  # (no lock: nothing tells whether its compile runs)
        older.mkdir()
        assert sorted(p.name for p in temp_folder.iterdir()) == sorted(
            [older.name, killed_folder.rsplit("/", 1)[1], live_folder.rsplit("/", 1)[1]])
        compile_cpu_om(affine_onnx(tmp_path / "a.onnx"), tmp_path / "a.om")
        assert sorted(p.name for p in temp_folder.iterdir()) == sorted([older.name, live_folder.rsplit("/", 1)[1]])
    finally:
        for proc in (live, killed):
            proc.kill()
            proc.communicate(timeout=60)  # (its pipe closed)
