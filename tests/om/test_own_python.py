"""The compile's child and ATC's leash (`python -c`, own_python.py) import no module from the
current folder: `-c` puts it first on sys.path, and `aclserve compile` run in a folder holding an
onnx.py failed with "cannot import name 'TensorProto' from 'onnx'" (a server started there failed
every .onnx it compiled; a grp.py there, "[Errno 1] Operation not permitted")."""
from __future__ import annotations

import os
import subprocess
import sys

from aclserve.om import atc_leash
from tests import REPO

# `aclserve compile ARGS` as the console script runs it: its sys.path[0] is its own folder, not the current one
CONSOLE = "import sys; sys.path.remove(''); from aclserve.cli import main; sys.exit(main(sys.argv[1:]))"
SHADOWS = ("onnx", "grp", "json", "subprocess")


def folder_of_shadows(folder):
    """`folder` holding modules named as the standard library's and onnx, each failing on import."""
    folder.mkdir()
    for name in SHADOWS:
        (folder / f"{name}.py").write_text(f"raise ImportError('the current folder\\'s {name}.py was imported')\n")
    return folder


def env_with_repo() -> dict:
    """This environment with the repository on PYTHONPATH (no empty entry: that would be the current folder)."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def test_compile_in_a_folder_holding_an_onnx_py_compiles(tmp_path):
    here = folder_of_shadows(tmp_path / "here")
    proc = subprocess.run([sys.executable, "-c", CONSOLE, "compile", REPO / "models" / "digits.onnx",
                           "-o", tmp_path / "digits.om", "--target", "cpu"],
                          cwd=here, env=env_with_repo(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "digits.om").stat().st_size > 0


def test_the_atc_leash_in_a_folder_holding_a_subprocess_py_runs_its_command(tmp_path):
    here = folder_of_shadows(tmp_path / "here")
    proc = subprocess.run(atc_leash.command([sys.executable, "-c", "print('ran')"]), cwd=here, env=env_with_repo(),
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr


def test_a_compile_whose_process_fails_unexpectedly_says_so_in_one_line(tmp_path):
    """An onnx.py on PYTHONPATH (the user's own path: kept) breaks the child's imports; its error
    came back as a RuntimeError that `aclserve compile` let out as a traceback."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "onnx.py").write_text("# an onnx of no use\n")
    env = env_with_repo()
    env["PYTHONPATH"] = str(shadow) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run([sys.executable, "-m", "aclserve", "compile", REPO / "models" / "digits.onnx",
                           "-o", tmp_path / "digits.om", "--target", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("aclserve compile: error: the compile failed: cannot import name 'TensorProto'")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
