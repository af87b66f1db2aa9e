"""The ACLSERVE_* variables aclserve does not read: one WARNING line at serve's start naming each,
with the closest known name, and one warning line from each other command reading the variables.
A misspelt one was silently ignored: ACLSERVE_API_TOKN=x started the server without a token (a
tester)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from aclserve.cli.environment import KNOWN, TEST_SUITE_PREFIX, unknown_names, warn_unknown
from tests import REPO


def _started(tmp_path, **variables) -> subprocess.CompletedProcess:
    """`aclserve serve` with `variables` set, stopped once its start has said its notes (by a
    models folder that does not exist)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("ACLSERVE_")}
    proc = subprocess.run([sys.executable, "-m", "aclserve", "serve", "--device", "cpu", "--port", "0", "--grpc-port",
                           "0", "--models", "none"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, **variables}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "models folder none does not exist" in proc.stderr, proc.stderr
    return proc


def test_an_unknown_variable_is_named_once_with_the_closest_known_one(tmp_path):
    proc = _started(tmp_path, ACLSERVE_API_TOKN="s3cret", ACLSERVE_CPU_DEVICE_MEMOR="1G", ACLSERVE_PORT="9000")
    lines = [line for line in proc.stderr.splitlines() if "not read by aclserve" in line]
    assert len(lines) == 1 and " WARNING aclserve.cli.environment: ACLSERVE_API_TOKN (did you mean " \
        "ACLSERVE_API_TOKEN?), ACLSERVE_CPU_DEVICE_MEMOR (did you mean ACLSERVE_CPU_DEVICE_MEMORY?), ACLSERVE_PORT: " \
        "not read by aclserve, ignored (known: ACLSERVE_API_TOKEN, " in lines[0], proc.stderr
    assert "s3cret" not in proc.stderr  # (a value is never said: it may be a token)


def test_the_closest_name_is_judged_without_the_prefix_all_share():
    """The shared ACLSERVE_ alone made ACLSERVE_PORT "close" to ACLSERVE_SRC (a review)."""
    assert "did you mean" not in warn_unknown({"ACLSERVE_PORT": "9000"})
    assert "ACLSERVE_TOKEN (did you mean ACLSERVE_API_TOKEN?)" in warn_unknown({"ACLSERVE_TOKEN": "x"})


def test_the_variables_aclserve_and_its_test_suite_set_are_not_warned_about(tmp_path):
    proc = _started(tmp_path, ACLSERVE_CPU_CHECK_HOST="1", ACLSERVE_HEALTH_PORT="8000",
                    ACLSERVE_TESTS_SHARED_NETWORK="1")
    assert "not read by aclserve" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr


def test_every_variable_aclserve_and_its_images_read_is_known():
    """The names are gathered from the modules that read them; a new one read elsewhere (or by
    deploy/'s images: their entrypoint, their HEALTHCHECK) must join them, or serve warns of it."""
    read = set()
    for folder, pattern in (("aclserve", "*.py"), ("deploy", "*")):
        for path in (REPO / folder).rglob(pattern):
            if path.is_file():
                read.update(re.findall(r"\bACLSERVE_[A-Z][A-Z_]*[A-Z]\b", path.read_text(errors="replace")))
    read = {name for name in read if not name.startswith(TEST_SUITE_PREFIX)}
    assert read and unknown_names(dict.fromkeys(read, "")) == [], read - KNOWN


@pytest.mark.parametrize("command", [("infer", "m", "-i", "x=x.npy", "--url", "http://127.0.0.1:9"),
                                     ("profile", "m", "--url", "http://127.0.0.1:9", "--seconds", "1"),
                                     ("compile", "missing.onnx")], ids=lambda command: command[0])
def test_the_other_commands_reading_the_variables_warn_once_too(tmp_path, command):
    """`serve` alone said it: `infer` with ACLSERVE_API_TOKN got a 401 without a word (a tester, t84).
    Said before the command runs, whatever becomes of it (here each fails)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("ACLSERVE_")}
    proc = subprocess.run([sys.executable, "-m", "aclserve", *command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(REPO), "ACLSERVE_API_TOKN": "s3cret"},
                          stdin=subprocess.DEVNULL)
    lines = [line for line in proc.stderr.splitlines() if "not read by aclserve" in line]
    assert len(lines) == 1 and lines[0].startswith(f"aclserve {command[0]}: warning: ACLSERVE_API_TOKN (did you mean "
                                                   "ACLSERVE_API_TOKEN?): not read by aclserve, ignored"), proc.stderr
    assert "s3cret" not in proc.stderr and proc.returncode != 0
