"""An `aclserve` command run in a process of its own, from the repository root unless told
(tests/test_cli*.py)."""
from __future__ import annotations

import subprocess
import sys

from tests import REPO


def run_aclserve(*args, cwd=REPO, timeout=120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)
