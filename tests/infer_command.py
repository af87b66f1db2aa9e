"""`aclserve infer` run in a process of its own against a server's URL (tests/test_cli_infer*.py)."""
from __future__ import annotations

import subprocess
import sys


def infer_at(url: str, *args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aclserve", "infer", *args, "--url", url], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
