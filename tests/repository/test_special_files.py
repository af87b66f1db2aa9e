"""What sits in the models folder or the compile cache never blocks or crashes a reader: a FIFO
(opening it for reading waits for a writer), a socket, a device node, or a symlink to one, is
refused without being opened and named as a problem in the index.

Every blocking call here runs under a guard (`unblocked`: a thread joined with a limit, or
asyncio.wait_for); on failure the guard wakes the reader stuck on a FIFO so the run ends with a
failed test, not a hang."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aclserve.config import CompileOptions, ModelConfig
from aclserve.om import atc_om, container
from aclserve.repository import cache_entry, compiler
from aclserve.repository.labels import LabelsError, read_labels
from aclserve.repository.layout import scan
from aclserve.repository.validate import InvalidModelFile, validate_om

from .repo_helpers import place, serving

LIMIT_S = 30.0  # a hang guard, not a timing check
DEFAULTS = ModelConfig()


def release_fifos(folder: Path) -> None:
    """Wake every reader blocked opening a FIFO under `folder`, and remove the FIFOs so no later
    scan blocks again: called when a guard gave up, so the test fails instead of hanging."""
    for path in folder.rglob("*"):
        if path.is_fifo():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # a reader waiting in open() wakes
            except OSError:
                pass
            path.unlink()


def unblocked(folder: Path, fn, *args):
    """fn(*args) in a thread, joined within LIMIT_S; its result, or its exception raised here."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn(*args)
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    if thread.is_alive():
        release_fifos(folder)
        thread.join(LIMIT_S)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on a special file")
    if "error" in out:
        raise out["error"]
    return out["result"]


def make_socket(path: Path) -> None:
    if len(os.fsencode(path)) >= 108:
        pytest.skip("tmp path too long for a unix socket")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(os.fspath(path))  # the socket file stays after the close
    finally:
        sock.close()


def make_device(path: Path) -> None:
    """A character device node like /dev/null (needs CAP_MKNOD, which root has here)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("no permission to make a device node")


@pytest.fixture
def om_bytes(model_files) -> bytes:
    return Path(model_files[1]["om"]).read_bytes()


# ---- the scan ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "symlink to a fifo"])
def test_a_special_config_file_is_a_problem_of_its_model_only(tmp_path, om_bytes, kind):
    (tmp_path / "a.om").write_bytes(om_bytes)
    (tmp_path / "m.om").write_bytes(om_bytes)
    config = tmp_path / "m.yaml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "socket":
        make_socket(config)
    elif kind == "device":
        make_device(config)
    else:
        os.mkfifo(tmp_path / ".pipe")
        config.symlink_to(tmp_path / ".pipe")
    result = unblocked(tmp_path, scan, tmp_path, DEFAULTS)
    assert set(result.models) == {"a"}
    named = {"fifo": "a FIFO", "socket": "a socket", "device": "a device node", "symlink to a fifo": "a FIFO"}
    assert "m.yaml" in result.problems["m"] and named[kind] in result.problems["m"], result.problems


def test_a_versioned_models_config_that_is_a_fifo_is_a_problem(tmp_path, om_bytes):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.om").write_bytes(om_bytes)
    os.mkfifo(tmp_path / "m" / "config.yaml")
    result = unblocked(tmp_path, scan, tmp_path, DEFAULTS)
    assert "m" not in result.models and "a FIFO" in result.problems["m"]


@pytest.mark.parametrize("make", [os.mkfifo, make_socket, make_device], ids=["fifo", "socket", "device"])
def test_a_special_model_file_is_named_with_what_it_is(tmp_path, make):
    make(tmp_path / "m.om")
    (tmp_path / "v" / "1").mkdir(parents=True)
    make(tmp_path / "v" / "1" / "model.onnx")
    result = unblocked(tmp_path, scan, tmp_path, DEFAULTS)
    kind = {os.mkfifo: "a FIFO", make_socket: "a socket", make_device: "a device node"}[make]
    assert result.models == {}
    assert result.problems["m"] == f"m.om is {kind}, not a regular file"
    assert result.problems["v"] == f"v/1/model.onnx is {kind}, not a regular file"


def test_a_version_that_is_a_fifo_instead_of_a_folder_is_named(tmp_path):
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "1")
    result = unblocked(tmp_path, scan, tmp_path, DEFAULTS)
    assert "m/1 is a FIFO, not a version folder" in result.problems["m"]


def test_a_labels_file_that_is_a_fifo_is_a_problem_at_the_scan(tmp_path, om_bytes):
    (tmp_path / "m.om").write_bytes(om_bytes)
    (tmp_path / "m.yaml").write_text("outputs: {y: {labels: y_labels.txt}}\n")
    os.mkfifo(tmp_path / "y_labels.txt")
    result = unblocked(tmp_path, scan, tmp_path, DEFAULTS)
    assert "m" not in result.models
    assert "labels" in result.problems["m"] and "a FIFO" in result.problems["m"], result.problems


# ---- what a load reads (the file may have been swapped since the scan) -------------------------
def test_labels_read_from_a_fifo_are_refused(tmp_path):
    os.mkfifo(tmp_path / "labels.txt")
    with pytest.raises(LabelsError, match="labels file labels.txt of output 'y': .*a FIFO"):
        unblocked(tmp_path, read_labels, str(tmp_path / "labels.txt"), 4, "y")


@pytest.mark.parametrize("reader", [validate_om, atc_om.identify, container.read, container.read_header])
def test_a_model_file_swapped_for_a_fifo_is_refused_by_every_reader(tmp_path, reader):
    os.mkfifo(tmp_path / "m.om")
    args = (str(tmp_path / "m.om"), "cpu") if reader is validate_om else (str(tmp_path / "m.om"),)
    with pytest.raises((InvalidModelFile, OSError), match="a FIFO"):
        unblocked(tmp_path, reader, *args)


# ---- the compile cache -------------------------------------------------------------------------
def test_an_onnx_source_that_is_a_fifo_is_refused_by_the_cache(tmp_path):
    os.mkfifo(tmp_path / "m.onnx")
    with pytest.raises(OSError, match="a FIFO"):
        unblocked(tmp_path, compiler.compiled_om, str(tmp_path / "m.onnx"), "m", CompileOptions(), "cpu",
                  tmp_path / "cache")


@pytest.mark.parametrize("where", ["manifest", "entry"])
def test_a_fifo_in_place_of_a_cache_entry_is_replaced_by_a_compile(tmp_path, model_files, where):
    cache = tmp_path / "cache"
    onnx = model_files[2]["onnx"]
    first = unblocked(tmp_path, compiler.compiled_om, onnx, "m", CompileOptions(), "cpu", cache)
    target = cache_entry.manifest_path(first) if where == "manifest" else first
    target.unlink()
    os.mkfifo(target)
    again = unblocked(tmp_path, compiler.compiled_om, onnx, "m", CompileOptions(), "cpu", cache)
    assert again == first and not target.is_fifo()
    key = compiler.cache_key(onnx, CompileOptions(), "cpu")
    assert cache_entry.problem(again, key) is None



def test_an_entry_built_under_other_compile_rules_is_built_again(tmp_path, model_files, monkeypatch):
    """The compile's checks come to refuse more (an output sized by the data, rows mixed by a
    branch on the whole batch): an entry a laxer aclserve built was served from the cache after
    an upgrade, its model never checked again. The rules are in the key: another entry is built."""
    cache, onnx = tmp_path / "cache", model_files[2]["onnx"]
    first = unblocked(tmp_path, compiler.compiled_om, onnx, "m", CompileOptions(), "cpu", cache)
    monkeypatch.setattr(cache_entry, "COMPILE_RULES", cache_entry.COMPILE_RULES + 1)
    again = unblocked(tmp_path, compiler.compiled_om, onnx, "m", CompileOptions(), "cpu", cache)
    assert again != first and again.is_file() and first.is_file()

# ---- the repository ------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_fifo_config_neither_blocks_start_nor_later_reloads(make_repo, models_dir, model_files):
    """The FIFO m.yaml used to hold the scan (and so start-up and every reload) forever."""
    shutil.copyfile(model_files[1]["om"], models_dir / "a.om")
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    os.mkfifo(models_dir / "m.yaml")
    os.mkfifo(models_dir / "junk.om")
    try:
        repo, events = await asyncio.wait_for(make_repo(), LIMIT_S)
        assert serving(repo) == ["a"]
        rows = {r["name"]: r for r in repo.index() if r["version"] == ""}
        assert rows["m"]["state"] == "UNAVAILABLE" and "m.yaml" in rows["m"]["reason"]
        assert "a FIFO" in rows["m"]["reason"] and "a FIFO" in rows["junk"]["reason"]
        os.mkfifo(models_dir / "late.om")  # one more, while the watcher follows the folder
        place(model_files[2]["om"], models_dir / "a.om")  # the watcher's scans go on
        await events.wait("reloaded", "a", limit_s=LIMIT_S)
        assert "a FIFO" in {r["name"]: r for r in repo.index()}["late"]["reason"]
    finally:
        release_fifos(models_dir)


@pytest.mark.asyncio
async def test_a_labels_file_turned_into_a_fifo_is_named_by_the_load_api(make_repo, models_dir, model_files):
    """The serving model keeps serving; asking to load it again answers why it cannot, at once
    (a labels file is read by the load: test_labels_read_from_a_fifo_are_refused)."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("outputs: {y: {labels: y_labels.txt}}\n")
    (models_dir / "y_labels.txt").write_text("a\nb\nc\nd\n")
    try:
        repo, _ = await asyncio.wait_for(make_repo(model_control_mode="explicit"), LIMIT_S)
        assert serving(repo) == ["m"]
        (models_dir / "y_labels.txt").unlink()
        os.mkfifo(models_dir / "y_labels.txt")
        with pytest.raises(Exception, match="a FIFO"):
            await asyncio.wait_for(repo.load("m"), LIMIT_S)
    finally:
        release_fifos(models_dir)


# ---- the CLI -------------------------------------------------------------------------------------
def _cli(tmp_path, *args):
    try:
        return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        release_fifos(tmp_path)
        pytest.fail(f"aclserve {' '.join(args)} blocked on a FIFO")


@pytest.mark.parametrize("command", [["inspect", "m.om"], ["compile", "m.onnx", "--target", "cpu"]])
def test_the_cli_refuses_a_fifo_in_one_line(tmp_path, command):
    os.mkfifo(tmp_path / command[1])
    proc = _cli(tmp_path, *command)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{command[1]}: is a FIFO" in proc.stderr, proc.stderr
