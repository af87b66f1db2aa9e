"""`aclserve serve` on a models folder it cannot use (missing, a file, on a path that cannot be
searched, without read permission) stops before it listens, saying so in one line; so does the
in-process profile."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests import REPO
from tests.aclserve_command import run_aclserve


def test_serve_without_a_models_folder_says_how_to_point_at_one(tmp_path):
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr and "--models" in proc.stderr
    assert "listening" not in proc.stderr, proc.stderr  # (it said so first, then exited)


def test_serve_with_a_file_as_models_folder_says_it_is_a_file(tmp_path):
    (tmp_path / "m.om").write_bytes(b"x")
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--models", "m.om", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "m.om is a file, not a folder" in proc.stderr and "listening" not in proc.stderr, proc.stderr


def test_a_models_folder_that_cannot_be_reached_is_said_so(tmp_path, monkeypatch):
    """A folder on the way that cannot be searched (EACCES; simulated: the tests run as root)
    was a bare "[Errno 13] Permission denied: 'locked/inner'"."""
    from pathlib import Path

    from aclserve.repository import RepositoryError, check_models_folder
    real_stat = Path.stat

    def stat(self, *args, **kwargs):
        if self.name == "inner":
            raise PermissionError(13, "Permission denied")
        return real_stat(self, *args, **kwargs)
    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(RepositoryError, match="models folder .*inner cannot be reached .Permission denied."):
        check_models_folder(tmp_path / "locked" / "inner")


def _as_a_user_without_read_permission() -> list[str] | None:
    """The command prefix that runs aclserve as one whom file permissions bind: none for a user
    other than root; for root, setpriv dropping the capabilities that read past them (None when
    it cannot, in a container without them, say)."""
    if os.geteuid() != 0:
        return []
    dropped = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    try:
        probe = subprocess.run([*dropped, "true"], capture_output=True, timeout=30)
    except OSError:
        return None
    return dropped if probe.returncode == 0 else None


@pytest.mark.parametrize("mode", [0o000, 0o644], ids=["000", "644"])
def test_serve_on_a_models_folder_it_cannot_read_says_so_and_does_not_start(tmp_path, mode):
    """`chmod 000 models` (or 644: listed, nothing in it looked at) started the server, never
    ready, its reason in one WARNING line and the repository index; 644 ended it on the first
    scan with a bare "[Errno 13] Permission denied: '.../digits.om'" once it listened. It stops
    before it listens, in explicit mode too (it loads every model at start); so does the
    in-process profile, which loads the folder as serve does."""
    prefix = _as_a_user_without_read_permission()
    if prefix is None:
        pytest.skip("no way to run as a user file permissions bind (root without setpriv)")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    (tmp_path / "models").chmod(mode)
    try:
        runs = [subprocess.run([*prefix, sys.executable, "-m", "aclserve", *command, "--device", "cpu"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
                for command in (["serve", "--port", "0", "--grpc-port", "0"],
                                ["serve", "--port", "0", "--grpc-port", "0", "--model-control-mode", "explicit"],
                                ["profile", "digits", "--seconds", "0.5", "--trace", str(tmp_path / "t.json")])]
    except subprocess.TimeoutExpired as e:  # (run() has killed it)
        pytest.fail(f"the server started: {e.stderr}")
    finally:
        (tmp_path / "models").chmod(0o755)
    for proc, command in zip(runs, ("serve", "serve", "profile")):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "listening" not in proc.stderr, proc.stderr
        assert proc.stderr == f"aclserve {command}: error: models folder models cannot be read (Permission denied): " \
                              "the user aclserve runs as needs read and search permission on it (r-x)\n", proc.stderr
