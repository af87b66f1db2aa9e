"""The command that runs `main(argv)` of one of aclserve's modules in a fresh Python: the compile's
child (compile_process.py) and ATC's leash (atc_leash.py).

It is `python -c CODE ROOT ARGS...`: the same interpreter and environment (PYTHONPATH and the
user's site-packages, where onnx and ONNX Runtime may be, are kept: no -I) but for its secrets
(environment(): the API token, which neither the compile nor ATC needs), aclserve imported from
ROOT, the folder this one was imported from (a folder named aclserve in the current one, or
another installed, is not taken for it), and no module from the current folder: `-c` puts it
first on sys.path (as ''), and an onnx.py or a grp.py in the folder `aclserve compile` or the
server was started from was imported for the real one (the compile failed with "cannot import
name 'TensorProto' from 'onnx'"). CODE takes '' out before it imports anything (sys is built in);
Python 3.11's -P would, but aclserve runs on 3.10 too. PYTHONPATH is the user's to keep: an empty
entry in it (`:/x`) names the current folder as an absolute path, which stays (README says so).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..secret_env import without_secrets

ROOT = str(Path(__file__).resolve().parents[2])


def code(module: str) -> str:
    """The program that runs `module`.main(ARGS) and exits with what it returns; ROOT is its first argument."""
    return ("import sys; sys.path[:] = [sys.argv.pop(1)] + [p for p in sys.path if p]; "
            f"from {module} import main; sys.exit(main(sys.argv[1:]))")


def command(module: str, *args: str) -> list[str]:
    """The command that runs `module`.main(args) in a fresh Python (see the module's doc)."""
    return [sys.executable, "-c", code(module), ROOT, *args]


def environment() -> dict[str, str]:
    """The environment `command` runs in: this process's, without the secrets it holds (the API
    token, ACLSERVE_API_TOKEN: ATC, a vendor binary, got it too, a tester found)."""
    return without_secrets()
