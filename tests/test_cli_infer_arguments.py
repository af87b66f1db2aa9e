"""`aclserve infer`'s arguments the command line refuses before anything is sent (exit 2, one
line): a --timeout, --version, --priority or --classification out of range, a .npy whose header
asks for more memory than there is. Nothing listens at the URL."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from aclserve.cli.usage import UsageError


def test_infer_refuses_a_timeout_past_30_days_in_one_line(tmp_path):
    """--timeout 1e10 was the socket's OverflowError traceback (timestamp out of range)."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    runs = {timeout: subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url",
                                     "http://127.0.0.1:1", "--timeout", timeout], cwd=tmp_path, capture_output=True,
                                    text=True, timeout=60) for timeout in ("1e10", "2592000")}
    assert runs["1e10"].returncode == 2 and runs["1e10"].stderr == (
        "aclserve infer: error: --timeout must be a positive number of seconds, at most 2,592,000 (30 days)\n")
    assert runs["2592000"].returncode == 1 and "cannot reach http://127.0.0.1:1" in runs["2592000"].stderr


def test_infer_refuses_a_npy_whose_header_asks_for_more_memory_than_there_is(tmp_path):
    from aclserve.cli.infer import _load_inputs
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000000, 64), }".ljust(117).encode() + b"\n"
    (tmp_path / "huge.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
    with pytest.raises(UsageError, match="huge.npy: its header's shape needs more memory than there is"):
        _load_inputs([f"x={tmp_path / 'huge.npy'}"])


@pytest.mark.parametrize("version", ["abc", "0", "-1", "1" * 19, "١"])
def test_a_version_no_model_can_have_is_refused_before_anything_is_sent(tmp_path, version):
    """`--version abc` went to the server, whose 400 was exit 1 (a server's error); it is the
    command line's, exit 2, as other bad arguments are (a tester, t86). Nothing listens at the URL."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--version", version,
                           "--url", "http://127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--version must be a positive integer of at most 18 digits" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("args, said", [
    (("--priority", "-1"), "--priority must be a level from 1 (the highest), or 0 for the model's default, at most "
                           "18446744073709551615 (a uint64), got -1"),
    (("--priority", str(2**64)), "--priority must be a level from 1 (the highest), or 0 for the model's default, at "
                                 "most 18446744073709551615 (a uint64), got 18446744073709551616"),
    # (it went on, read past 64 bits as a float, for the server's untrue "must be a non-negative integer")
    (("--classification", "99999999999999999999"), "--classification must be a number of classes from 1 to 65,536, "
                                                   "the most class strings an answer holds, got 99999999999999999999"),
    (("--classification", "0"), "--classification must be a number of classes from 1 to 65,536"),
])
def test_a_priority_or_classification_the_server_refuses_is_refused_before_anything_is_sent(tmp_path, args, said):
    """`--priority -1` was refused by the server alone, exit 1 (a server's error), where the other
    arguments' mistakes are the command line's, exit 2 (a tester, t92). Nothing listens at the URL."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", *args,
                           "--url", "http://127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"aclserve infer: error: {said}"), proc.stderr
