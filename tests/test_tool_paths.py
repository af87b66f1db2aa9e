"""The benchmark tools take a path relative to the folder they are started in, though the server
or the builder they start runs in the repository's root (found in review: `attack_server.py
--config server.yaml` started from another folder handed the server a path that named a file of
the checkout, and the server stopped, "cannot read config file")."""
from __future__ import annotations

import os
import subprocess
import sys

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_server  # noqa: E402


def test_attack_server_takes_its_config_relative_to_where_it_is_started(tmp_path):
    (tmp_path / "server.yaml").write_text("log_level: warning\n")
    (tmp_path / "tmp").mkdir()
    done = subprocess.run([sys.executable, str(REPO / "tools" / "attack_server.py"), "--attacks", "idle",
                           "--conns", "1", "--hold-s", "0.1", "--config", "server.yaml"],
                          cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| idle |" in done.stdout, done.stdout


def test_the_example_models_folder_is_taken_relative_to_where_the_tool_is_started(tmp_path, monkeypatch):
    """bench_server's and bench_overload's --models-src, bench_images' --models-dir: the models
    were checked for where the tool was started but built into the repository's root, and the
    compile that followed (in the root too) read them there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo").mkdir()
    onnx = bench_server.prepare_repository("example-models", str(tmp_path / "repo"), only=("medium",))
    built = tmp_path / "example-models" / "medium.onnx"
    assert built.is_file(), "not built where the tool was started"
    assert os.path.isabs(onnx["medium"]) and os.path.samefile(onnx["medium"], built), onnx
    assert (tmp_path / "repo" / "medium.om").is_file()


def test_perf_analyzer_given_by_name_is_the_one_on_path_not_a_file_of_the_current_folder(tmp_path, monkeypatch):
    """`--perf-analyzer NAME` was checked in the current folder and then run from PATH: a program
    other than the one checked, or none."""
    from bench_grpc import find_perf_analyzer
    on_path, here = tmp_path / "bin", tmp_path / "here"
    on_path.mkdir(), here.mkdir()
    for folder in (on_path, here):
        (folder / "pa").write_text("#!/bin/sh\n")
        (folder / "pa").chmod(0o755)
    monkeypatch.chdir(here)
    monkeypatch.setenv("PATH", str(on_path))
    assert find_perf_analyzer("pa") == str(on_path / "pa")
    assert find_perf_analyzer("./pa") == str(here / "pa")  # a name with a folder is taken as it is
    (on_path / "pa").unlink()
    assert find_perf_analyzer("pa") is None  # not the current folder's
