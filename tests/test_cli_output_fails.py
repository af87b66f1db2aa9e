"""A command whose stdout or stderr cannot be written (a pipe whose reader left, `> /dev/full`,
`2>&-`): real `aclserve` processes. Before, a compile printing its progress into a closed pipe said
"cannot write out.om: Broken pipe" (exit 2, the OM thrown away), inspect, infer and profile into a
full device were an OSError traceback, and infer's cast note to a failing stderr was reported as
"http://...: broke off the exchange" (a tester's finds). The rule (cli/output.py): what cannot be
written is dropped, the command does its work, then exits 141 for a gone reader or 74 for another
error of stdout, saying so on stderr; a failing stderr changes nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import REPO
from tests.serving import ServerThread, server_config

FULL = "No space left on device"


def _aclserve(*args, cwd, stdout=None, stderr=subprocess.PIPE, closed=None):
    """The command's (status, stdout, stderr): stdout a pipe unless given; `closed`: an fd closed at its start."""
    proc = subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE if stdout is None else stdout, stderr=stderr, text=True, timeout=300,
                          preexec_fn=None if closed is None else (lambda: os.close(closed)))
    return proc.returncode, proc.stdout or "", proc.stderr or ""


def _reader_gone_pipe():
    """The write end of a pipe whose read end is closed: every write gets EPIPE (`| true` that has left)."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_compile_into_a_pipe_whose_reader_left_writes_the_om_and_exits_141(tmp_path):
    write = _reader_gone_pipe()
    try:
        status, _, stderr = _aclserve("compile", str(REPO / "models" / "digits.onnx"), "-o", "out.om",
                                      "--target", "cpu", cwd=tmp_path, stdout=write)
    finally:
        os.close(write)
    assert status == 141 and stderr == "", stderr
    assert (tmp_path / "out.om").stat().st_size > 1000


def test_compile_into_a_full_device_writes_the_om_and_says_stdout_failed(tmp_path):
    with open("/dev/full", "w") as full:
        status, _, stderr = _aclserve("compile", str(REPO / "models" / "digits.onnx"), "-o", "out.om",
                                      "--target", "cpu", cwd=tmp_path, stdout=full)
    assert status == 74 and stderr.splitlines() == [
        f"aclserve compile: error: cannot write its output to stdout: {FULL}"], stderr
    assert (tmp_path / "out.om").stat().st_size > 1000


def test_inspect_into_a_full_device_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        status, _, stderr = _aclserve("inspect", str(REPO / "models" / "digits.om"), cwd=tmp_path, stdout=full)
    assert status == 74 and stderr.splitlines() == [
        f"aclserve inspect: error: cannot write its output to stdout: {FULL}"], stderr


def test_profile_into_a_full_device_is_one_line(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models")
    with open("/dev/full", "w") as full:
        status, _, stderr = _aclserve("profile", "digits", "--seconds", "0.5", "--clients", "1", "--models", "models",
                                      cwd=tmp_path, stdout=full)
    assert status == 74 and f"aclserve profile: error: cannot write its output to stdout: {FULL}" in stderr
    assert "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def digits_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    (folder / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", folder / "models")
    np.save(folder / "x64.npy", np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][:1].astype(np.float64))
    with ServerThread(server_config(folder / "models", model_control_mode="none")) as server:
        yield folder, f"http://{server.url}"


def test_infer_into_a_full_device_is_one_line(digits_server):
    folder, url = digits_server
    with open("/dev/full", "w") as full:
        status, _, stderr = _aclserve("infer", "digits", "-i", "x=x64.npy", "--url", url, cwd=folder, stdout=full)
    assert status == 74 and stderr.splitlines() == [
        "aclserve infer: input x: float64 cast to FP32 as the model declares",
        f"aclserve infer: error: cannot write its output to stdout: {FULL}"], stderr


@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_infer_whose_cast_note_cannot_be_written_still_infers(digits_server, stderr):
    folder, url = digits_server
    args = ("infer", "digits", "-i", "x=x64.npy", "--url", url)
    if stderr == "closed":
        status, stdout, _ = _aclserve(*args, cwd=folder, stderr=subprocess.DEVNULL, closed=2)
    else:
        with open("/dev/full", "w") as full:
            status, stdout, _ = _aclserve(*args, cwd=folder, stderr=full)
    assert status == 0 and stdout.startswith("y float32 [1, 10]"), stdout
