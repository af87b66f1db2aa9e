"""An `aclserve` command run in a process of its own, from the repository root unless told
(tests/test_cli*.py); leashed (processes.leashed_run): a `serve` expected to refuse to start that
served instead dies with the test run, however it ends."""
from __future__ import annotations

import subprocess
import sys

from tests import REPO
from tests.processes import leashed_run


def run_aclserve(*args, cwd=REPO, timeout=120, env=None) -> subprocess.CompletedProcess:
    return leashed_run([sys.executable, "-m", "aclserve", *args], cwd=cwd, capture_output=True, text=True, env=env,
                       timeout=timeout)
