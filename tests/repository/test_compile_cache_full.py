"""Errors writing the compile cache, said the same at every try. A dropped .onnx whose compile
finds the cache's disk full: its reason names the cache folder and says the disk is full (index,
log line, /metrics label). It named the file the compile's child was writing in its work folder,
`.cache/.<entry>.compiling-<random>/<entry>.om`, whose random part is new at every try: each
retry logged another reason and made another aclserve_model_load_failure series (tester t30).
Another error there names the entry; one writing a manifest names the manifest, not its
temporary file.

The disk is a real one that is full: a 64 KB tmpfs, filled, in a mount namespace of the test's
own (`unshare -m`, its mounts seen by nothing outside it), with a network namespace of its own
for the server's ports (`unshare -n`, its loopback brought up); a file too large is one past the
RLIMIT_FSIZE of the compile's process. An entry whose manifest cannot be written is removed, not
left for the next try to find without one."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest

from aclserve.repository import ModelLoadFailed
from tests import REPO
from tests.processes import run_as_group
from tests.tiny_models import scale_onnx

from .repo_helpers import place, until

# run inside the namespaces: a 64 KB tmpfs at FS, filled, the .onnx dropped into FS/models;
# `aclserve serve` on it until its third failure to load c1 (two retries, said at debug level as they
# fail as the first did), its index and metrics read then, the disk emptied, the load waited for;
# prints the log's lines and what was read (JSON)
SCRIPT = r"""
import json, os, re, shutil, subprocess, sys, time, urllib.request
from tests.processes import leashed_popen  # (its server dies with it, as it dies with the test)
fs, onnx, config = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", fs], check=True)
models = os.path.join(fs, "models")
os.mkdir(models)
shutil.copy(onnx, os.path.join(models, "c1.onnx"))
filler = os.open(os.path.join(fs, "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(filler, bytes(4096))
except OSError:  # ENOSPC: full
    os.close(filler)
proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", models, "--host", "127.0.0.1",
                      "--port", "18000", "--grpc-port", "18001", "--device", "cpu", "--readiness", "lenient",
                      "--config", config, "--log-level", "debug"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def get(path, body=None):
    with urllib.request.urlopen("http://127.0.0.1:18000" + path, data=body, timeout=30) as answer:
        return answer.read().decode()


def c1(index):
    return next(entry for entry in json.loads(index) if entry["name"] == "c1")


failures, lines = [], []
while len(failures) < 3:
    line = proc.stderr.readline()
    if not line:
        break
    lines.append(line.rstrip())
    if "c1: version 1" in line and "not loaded" in line:
        failures.append(re.split("not loaded(?:, as before)?: ", line, maxsplit=1)[1].rstrip())
read = {}
while "metrics" not in read:  # (a retry may be compiling now: read again until it has failed again)
    entry = c1(get("/v2/repository/index", b"{}"))
    labels = [l for l in get("/metrics").splitlines() if l.startswith('aclserve_model_load_failure{model="c1"')]
    if entry["state"] == "UNAVAILABLE" and len(labels) == 1:
        read = {"index": entry["reason"], "metrics": labels[0]}
    time.sleep(0.05)
os.unlink(os.path.join(fs, "filler"))
while c1(get("/v2/repository/index", b"{}"))["state"] != "READY":
    time.sleep(0.05)
read["cache"] = sorted(os.listdir(os.path.join(models, ".cache")))
proc.terminate()
proc.communicate(timeout=60)
print(json.dumps({"failures": failures, "lines": lines, "models": models} | read))
"""


def _in_namespaces(*command: str) -> subprocess.CompletedProcess:
    # (the server it starts killed with it, should it time out or fail: run_as_group)
    return run_as_group(["unshare", "-m", "-n", "--propagation", "private", "sh", "-c",
                         'ip link set lo up && exec "$@"', "sh", *command],
                        timeout=110, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO)))


def _namespaces_here(folder) -> bool:
    """unshare -m -n (root), ip, and a tmpfs that can be mounted there."""
    if not (shutil.which("unshare") and shutil.which("ip") and shutil.which("mount")):
        return False
    return _in_namespaces("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)).returncode == 0


def test_a_full_compile_cache_is_said_naming_its_folder_the_same_at_every_retry(tmp_path):
    fs = tmp_path / "fs"
    fs.mkdir()
    if not _namespaces_here(fs):
        pytest.skip("needs unshare -m -n (root), ip and mount, to fill a tmpfs of its own")
    onnx = scale_onnx(tmp_path / "c1.onnx", 2.0)
    config = tmp_path / "config.yaml"  # (retries soon after one another: 0.1 to 0.4 s)
    config.write_text("load_retry_initial_s: 0.2\nload_retry_max_s: 0.4\n")
    done = _in_namespaces(sys.executable, "-c", SCRIPT, str(fs), onnx, str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    cache = os.path.join(found["models"], ".cache")
    # the first failure and two retries: one text, the disk full and the cache folder named
    reasons = {failure.rsplit(": retry ", 1)[0] for failure in found["failures"]}
    assert len(found["failures"]) == 3 and len(reasons) == 1, found["failures"]
    said = f"[Errno 28] No space left on device: {cache}, the compile cache (the host short of resources"
    assert reasons == {said}, found["failures"]
    assert not any(".compiling-" in line for line in found["lines"]), found["lines"]
    # the index and the metric label say it too (the models folder as <models>)
    shown = said.replace(found["models"], "<models>")
    assert found["index"].startswith(shown + ": retry "), found["index"]
    assert f'reason="{shown})"' in found["metrics"], found["metrics"]
    # room again: the retry compiled it (entry and manifest; no work folder left)
    assert len(found["cache"]) == 2 and found["cache"][1] == found["cache"][0] + ".json", found["cache"]


def test_a_full_compile_cache_of_its_own_folder_is_said_once_redacted(tmp_path):
    """A compile_cache_dir of its own is shown by its name to clients: a full one read "No space
    left on device: the compile cache cache" for a folder named cache (found by a tester)."""
    import errno
    from pathlib import Path
    from aclserve.repository.compile_cache import _told
    from aclserve.server.redact import PathRedactor
    cache = tmp_path / "cache"
    told = _told(OSError(errno.ENOSPC, "No space left on device", str(cache / "x.om")), Path(cache))
    assert str(told) == f"[Errno 28] No space left on device: {cache}, the compile cache"
    shown = PathRedactor(str(tmp_path / "models"), str(cache))(str(told))
    assert shown == "[Errno 28] No space left on device: cache, the compile cache"


# a compile cache whose files may hold at most 1 KB (RLIMIT_FSIZE, which its compile's child
# inherits): the CPU OM's write fails (EFBIG); what each of two tries raised, one line each
LIMITED = r"""
import resource, sys
from aclserve.config import CompileOptions
from aclserve.repository.compile_cache import CompileCache
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
cache = CompileCache("", sys.argv[1])
for _ in range(2):
    try:
        cache.compiled(sys.argv[2], "c1", CompileOptions(), "cpu", None)
    except OSError as e:
        print(e)
"""


def test_another_error_writing_a_compile_names_its_entry_not_the_work_folder(tmp_path):
    """Another error than a full disk, in the compile's work folder: the entry being compiled is
    named (as `aclserve compile` names its output), not `.<entry>.compiling-<random>/<entry>.om`."""
    models = tmp_path / "models"
    models.mkdir()
    onnx = scale_onnx(models / "c1.onnx", 2.0)
    done = subprocess.run([sys.executable, "-c", LIMITED, str(models), onnx], capture_output=True, text=True,
                          timeout=110, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()
    assert first == second, done.stdout
    assert re.fullmatch(rf"\[Errno 27\] File too large: '{re.escape(str(models))}/\.cache/c1-[0-9a-f]{{32}}\.om'",
                        first), first


# inside a mount namespace: an entry on a tmpfs at FS, the tmpfs then made read-only; what two
# tries to add its input bounds to its manifest raised (the write's temporary file cannot be made)
READ_ONLY = r"""
import subprocess, sys
from aclserve.repository import cache_entry
fs = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", fs], check=True)
om = fs + "/c1-" + "0" * 32 + ".om"
with open(om, "wb") as f:
    f.write(b"an OM")
cache_entry.record(om, "key", {}, "cpu")
subprocess.run(["mount", "-o", "remount,ro", fs], check=True)
for _ in range(2):
    try:
        cache_entry.keep_index_bounds(om, {"ids": 4})
    except OSError as e:
        print(e)
"""


def test_a_manifest_that_cannot_be_written_is_named_not_its_temporary_file(tmp_path):
    fs = tmp_path / "fs"
    fs.mkdir()
    if not _namespaces_here(fs):
        pytest.skip("needs unshare -m -n (root), ip and mount, to make a tmpfs of its own read-only")
    done = _in_namespaces(sys.executable, "-c", READ_ONLY, str(fs))
    assert done.returncode == 0, done.stderr[-3000:]
    said = f"[Errno 30] Read-only file system: '{fs}/c1-{'0' * 32}.om.json'"
    assert done.stdout.splitlines() == [said, said], done.stdout


async def _compile_held_then_let_go(holds, before_it_goes=lambda: None) -> None:
    """The compile's child holding (compile_holds), then let go once `before_it_goes()` ran."""
    await until(lambda: any(holds.iterdir()), "the compile's process holding")
    (mark,) = holds.iterdir()
    before_it_goes()
    mark.unlink()


@pytest.mark.asyncio
async def test_an_entry_whose_manifest_cannot_be_written_is_removed(make_repo, models_dir, model_files,
                                                                   compile_holds, caplog):
    """With a few KB free in the compile cache the .om was written and its manifest was not: the
    .om stayed, and every retry said `cached compile ... not used: it has no manifest; deleting it
    and compiling again` of that leftover (tester t87). Here the manifest's rename fails (a
    folder with a file in it is put where it goes while the compile is held): the load fails
    naming the manifest and leaves no .om; the next load, the folder gone, compiles without that
    line and serves."""
    caplog.set_level(logging.WARNING, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    cache = models_dir / ".cache"
    blocker = []

    def block_the_manifest() -> None:
        (work,) = [p for p in cache.iterdir() if ".compiling-" in p.name]  # (.<entry stem>.compiling-<random>)
        manifest = cache / (work.name[1:].split(".compiling-")[0] + ".om.json")
        manifest.mkdir()
        (manifest / "kept").write_text("a file: no rename replaces this folder")
        blocker.append(manifest)
    load = asyncio.ensure_future(repo.load("o"))
    await _compile_held_then_let_go(compile_holds, block_the_manifest)
    with pytest.raises(ModelLoadFailed, match=re.escape(str(blocker[0]))):
        await load
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [blocker[0].name]  # no .om
    shutil.rmtree(blocker[0])
    again = asyncio.ensure_future(repo.load("o"))
    await _compile_held_then_let_go(compile_holds)
    await again
    assert "no manifest" not in caplog.text, caplog.text
    assert float((await repo.get("o").infer({"x": [[1.0] * 4]}, 1)).outputs["y"][0, 0]) == 2.0
