"""The import contracts of .importlinter (layers, the server's and the scheduler's use of the runtime,
the acl module's importers, the network at the edge, no aiohttp on the gRPC path, no cycles), checked
by import-linter over this checkout's aclserve/ as part of the test suite; and each forbidden and
protected contract broken by an import it forbids, in a copy of aclserve/."""
import configparser
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lint_imports() -> str:
    """The `lint-imports` of this interpreter's environment (the one the test extras installed)."""
    beside = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    found = beside if os.path.exists(beside) else shutil.which("lint-imports")
    assert found, "lint-imports not found: pip install -e '.[test]' installs import-linter"
    return found


def run_lint_imports(root: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=root)  # analyse that tree even when another checkout is installed
    return subprocess.run([lint_imports(), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_are_kept():
    proc = run_lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# An import each contract forbids, and the start of that contract's name. The first three an architecture
# review (t62) added in place and lint-imports kept them all, though README "Layers" said otherwise.
ACL = "only acl/, runtime/ and the DVPP decoder import aclserve.acl"
FORBIDDEN = [
    ("scheduling/company.py", "from ..runtime import pool", "the scheduler knows the runtime only by"),
    ("server/redact.py", "from .. import acl", ACL),
    ("repository/labels.py", "from ..acl.cpu import rt", ACL),
    ("runtime/types.py", "from ..acl import constants", "runtime/batch.py and runtime/types.py, which the"),
    ("images/plan.py", "from tritonclient.grpc import model_config_pb2", "the network stays at the edge"),
    ("server/redact.py", "from ..runtime import pool", "the server uses only the runtime's data types"),
    ("server/infer_pipeline.py", "from aiohttp import web", "the gRPC transport and the infer path"),
]


@pytest.mark.parametrize("module, line, contract", FORBIDDEN, ids=[m for m, _, _ in FORBIDDEN])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    shutil.copytree(os.path.join(ROOT, "aclserve"), tmp_path / "aclserve",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, ".importlinter"), tmp_path)
    with open(tmp_path / "aclserve" / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}\n")
    proc = run_lint_imports(str(tmp_path))
    said = " ".join(proc.stdout.split())  # its report wraps long contract names
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"Contracts: \d+ kept, 1 broken", said), said
    assert verdict(said, contract) == "BROKEN", said


def verdict(said: str, contract: str) -> str:
    """KEPT or BROKEN: what lint-imports' report says after the contract's name."""
    rest = said[said.index(contract):]
    return min((rest.index(word), word) for word in (" KEPT", " BROKEN") if word in rest)[1].strip()


def test_every_grpc_module_is_held_to_the_no_aiohttp_contract():
    """import-linter's wildcards replace whole module names only, so the gRPC modules are listed one
    by one: a new server/grpc_*.py left off the list would import aiohttp unseen."""
    contracts = configparser.ConfigParser()
    contracts.read(os.path.join(ROOT, ".importlinter"))
    listed = set(contracts["importlinter:contract:grpc-without-aiohttp"]["source_modules"].split())
    grpc = {"aclserve.server." + os.path.basename(path)[:-3]
            for path in glob.glob(os.path.join(ROOT, "aclserve", "server", "grpc_*.py"))}
    assert grpc and grpc <= listed, sorted(grpc - listed)
