"""The import contracts of .importlinter (layers, the server's use of the runtime, no cycles),
checked by import-linter over this checkout's aclserve/ as part of the test suite."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lint_imports() -> str:
    """The `lint-imports` of this interpreter's environment (the one the test extras installed)."""
    beside = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    found = beside if os.path.exists(beside) else shutil.which("lint-imports")
    assert found, "lint-imports not found: pip install -e '.[test]' installs import-linter"
    return found


def test_import_contracts_are_kept():
    env = dict(os.environ, PYTHONPATH=ROOT)  # analyse this checkout even when another one is installed
    proc = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
