"""Scripts run in a process of their own, for the tests that fail a CPU device as a whole: the CPU
runtime's device stays failed until every user of it lets go, so the suite's process must not be one."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import REPO


def run_script(script: str, *args: str, devices: int | None = None, timeout: float = 180,
               **env: str) -> tuple[dict, str]:
    """Run `script` (`python -c`) with `args` from the repository, without the suite's injected
    faults (ACLSERVE_CPU_FAULTS), on `devices` CPU devices if given, `env` added; it must exit 0.
    Returns what its last line of output printed (JSON) and its stderr."""
    kept = {k: v for k, v in os.environ.items() if k != "ACLSERVE_CPU_FAULTS"}
    if devices is not None:
        env["ACLSERVE_CPU_DEVICES"] = str(devices)
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=dict(kept, PYTHONPATH=str(REPO), **env), cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
