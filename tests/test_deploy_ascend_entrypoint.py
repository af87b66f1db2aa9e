"""deploy/ascend-entrypoint.sh, the Ascend image's entrypoint, run for real with bash over a fake
Ascend root (ACLSERVE_ASCEND_ROOT) holding fake set_env.sh scripts, and a fake environment
(ACLSERVE_VENV) whose bin/python writes down how it was started. No CANN is involved: what is
checked is which set_env.sh is sourced, what the server's process is given, and the one line a
container without CANN says. The constraints the image installs with (deploy/ascend-constraints.txt)
are checked against setup.py's requirements."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tests import REPO

ENTRYPOINT = REPO / "deploy" / "ascend-entrypoint.sh"
RECORDER = """#!/bin/sh
exec "{python}" -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}))' "$@"
"""


def fake_set_env(path: Path, marker: str) -> Path:
    """A set_env.sh that adds to LD_LIBRARY_PATH, as CANN's does, and says it ran and with how many arguments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'export SOURCED="{marker} $#"\n'
                    f'export LD_LIBRARY_PATH="/cann/{marker}/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
                    "test -d /no/such/optional/folder\n")  # its last line false: not a failure
    return path


def venv(tmp_path: Path, python: str | None = None) -> Path:
    """An ACLSERVE_VENV whose bin/python records its arguments and environment (or is `python`)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    if python is not None:
        (bin_dir / "python").symlink_to(python)
    else:
        (bin_dir / "python").write_text(RECORDER.format(python=sys.executable))
        (bin_dir / "python").chmod(0o755)
    return bin_dir.parent


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "ACLSERVE_ASCEND_ROOT": str(tmp_path / "Ascend"),
            "ACLSERVE_VENV": str(tmp_path / "venv"), "LD_LIBRARY_PATH": "/before"}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)


def started(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_toolkit_set_env_is_sourced_and_the_server_started_as_a_module(tmp_path):
    root = tmp_path / "Ascend"
    fake_set_env(root / "ascend-toolkit" / "set_env.sh", "toolkit")
    fake_set_env(root / "cann" / "set_env.sh", "cann")
    venv(tmp_path)
    got = started(run(tmp_path, "--host", "0.0.0.0", "--models", "/models"))
    assert got["argv"] == ["-m", "aclserve", "serve", "--host", "0.0.0.0", "--models", "/models"]
    assert got["env"]["SOURCED"] == "toolkit 0"  # the server's arguments are not set_env.sh's
    # the driver's libraries first, as Ascend's container guides set them, then set_env.sh's and what was there
    assert got["env"]["LD_LIBRARY_PATH"].split(":") == [
        f"{root}/driver/lib64/common", f"{root}/driver/lib64/driver", f"{root}/driver/lib64", "/cann/toolkit/lib64",
        "/before"]


def test_a_set_env_that_sets_the_entrypoints_names_changes_neither_arguments_nor_library_path(tmp_path):
    """The entrypoint kept its state in plain names (root, args, tried, set_env) across `source`: a
    vendor's set_env.sh assigning one of them gave the server other arguments, or put another
    driver folder on LD_LIBRARY_PATH (a review of the deploy files). Its names are its own now,
    and what the server is started with is settled before set_env.sh runs."""
    root = tmp_path / "Ascend"
    script = fake_set_env(root / "cann" / "set_env.sh", "cann")
    with script.open("a") as f:
        f.write('root=/vendor; args=(--vendor); tried=(x); set_env=/vendor/set_env.sh; candidate=y\n'
                'driver=/vendor/driver; ACLSERVE_ASCEND_ROOT=/vendor; ACLSERVE_VENV=/vendor/venv\n')
    venv(tmp_path)
    got = started(run(tmp_path, "--models", "/models"))
    assert got["argv"] == ["-m", "aclserve", "serve", "--models", "/models"]
    assert got["env"]["SOURCED"] == "cann 0"
    assert got["env"]["LD_LIBRARY_PATH"].split(":")[:3] == [
        f"{root}/driver/lib64/common", f"{root}/driver/lib64/driver", f"{root}/driver/lib64"]


def test_newer_cann_layout_and_an_explicit_set_env_are_found(tmp_path):
    """CANN 8.x installs /usr/local/Ascend/cann/set_env.sh, where the entrypoint sourced only
    ascend-toolkit/set_env.sh (the container restart-looped); ASCEND_SET_ENV names another."""
    root = tmp_path / "Ascend"
    fake_set_env(root / "cann" / "set_env.sh", "cann")
    venv(tmp_path)
    assert started(run(tmp_path))["env"]["SOURCED"] == "cann 0"
    elsewhere = fake_set_env(tmp_path / "opt" / "cann-9" / "set_env.sh", "explicit")
    assert started(run(tmp_path, ASCEND_SET_ENV=str(elsewhere)))["env"]["SOURCED"] == "explicit 0"


def test_without_cann_one_line_names_the_paths_tried(tmp_path):
    venv(tmp_path)
    root = tmp_path / "Ascend"
    proc = run(tmp_path, "--host", "0.0.0.0")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"{root}/ascend-toolkit/set_env.sh, {root}/cann/set_env.sh" in proc.stderr
    assert "ASCEND_SET_ENV" in proc.stderr
    fake_set_env(root / "cann" / "set_env.sh", "cann")  # named, it is the only one tried
    proc = run(tmp_path, ASCEND_SET_ENV=str(tmp_path / "missing.sh"))
    assert proc.returncode == 1 and f"(tried {tmp_path}/missing.sh)" in proc.stderr, proc.stderr


def test_the_module_the_entrypoint_runs_is_the_server(tmp_path):
    """`python -m aclserve serve`, no console script: the real interpreter answers its --help."""
    fake_set_env(tmp_path / "Ascend" / "cann" / "set_env.sh", "cann")
    venv(tmp_path, python=sys.executable)
    proc = run(tmp_path, "--help", PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert "--models" in proc.stdout and "--grpc-port" in proc.stdout


def test_the_constraints_keep_numpy_below_2_where_cann_asks_and_setup_py_admits_it():
    """CANN's dependency table: numpy >= 1.19.2 and < 2.0 with Python below 3.13 (above 2.1 from
    3.13); pip would install numpy 2 into the image's environment otherwise."""
    lines = [line.strip() for line in (REPO / "deploy" / "ascend-constraints.txt").read_text().splitlines()]
    constraints = [Requirement(line) for line in lines if line and not line.startswith("#")]
    numpy = next(c for c in constraints if c.name == "numpy")
    assert not numpy.specifier.contains("2.0.0") and numpy.specifier.contains("1.26.4")
    assert numpy.marker.evaluate({"python_version": "3.11"}) and not numpy.marker.evaluate({"python_version": "3.13"})
    assert "protobuf" not in {c.name for c in constraints}  # aclserve's own environment needs protobuf 6
    setup = (REPO / "setup.py").read_text()
    required = Requirement(next(r for r in setup.split('"') if r.startswith("numpy")))
    assert required.specifier.contains("1.26.4")  # a numpy 1.x setup.py accepts
