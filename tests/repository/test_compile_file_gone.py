"""Poll mode: a dropped .onnx deleted (or replaced: deleted and a new file dropped in) while it
compiles, or while its load waits for another process's compile of the same file, ends that work
at once, as an unload through the API does: the compile's child process is killed, the wait
ends, nothing is left in the cache folder, and the log says why. It went on to the end (a
compile of minutes, a wait of up to the other's compile_timeout_s) for a result the load then
dropped, and a replaced file's stale compile went into service until the new file's replaced it.
A new version's compile stopped so leaves the version it was to replace serving.
Real repository on the CPU runtime and its real watcher; each compile is held in its child by
`compile_holds` (tests/conftest.py), a warm-up run by a CPU-runtime fault (`held_run`)."""
from __future__ import annotations

import logging
import os

import pytest

from aclserve.errors import NotFound
from aclserve.repository.compiler import WAITING_ELSEWHERE, cache_key
from aclserve.repository.entry_locks import exclusive

from .repo_helpers import held_run, place, until, x_rows
from .test_compile_process import held_child, running

pytestmark = pytest.mark.asyncio


def rows_of(repo, name: str) -> list[tuple[str, str]]:
    return [(r["state"], r["reason"]) for r in repo.index() if r["name"] == name and r["version"]]


async def answer(repo, name: str) -> float:
    return float((await repo.get(name).infer(x_rows(), 1)).outputs["y"][0, 0])


async def test_a_file_deleted_while_it_compiles_ends_the_compile(make_repo, models_dir, model_files, compile_holds,
                                                                 caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo()
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    pid = held_child(compile_holds)
    assert rows_of(repo, "o") == [("LOADING", "compiling o.onnx for cpu")]
    (models_dir / "o.onnx").unlink()
    await until(lambda: not running(pid), "the compile's process ended")  # (it held until the test's end)
    await repo.wait_idle()
    assert rows_of(repo, "o") == []  # as any model deleted
    with pytest.raises(NotFound, match="unknown model 'o'"):
        repo.get("o")
    assert os.listdir(models_dir / ".cache") == []  # no work folder, partial OM nor lock
    assert "o: the compile of version 1 was stopped (its file is gone)" in caplog.text
    assert repo.load_failures() == {} and events.count("load_failed", "o") == 0


async def test_a_file_replaced_while_it_compiles_compiles_the_new_file_instead(
        make_repo, models_dir, model_files, compile_holds, caplog):
    """The stale compile ends and the new file is compiled: it alone goes into service (before, the
    old compile ended, went live, then was reloaded with the new file)."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo()
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    stale = held_child(compile_holds)
    place(model_files[3]["onnx"], models_dir / "o.onnx")  # another model (scale 3) in its place
    await until(lambda: not running(stale), "the stale compile's process ended")
    (compile_holds / str(stale)).unlink()  # (the killed child's mark)
    await until(lambda: any(compile_holds.iterdir()), "the new file's compile holding")
    (compile_holds / str(held_child(compile_holds))).unlink()
    await events.wait("loaded", "o")
    await repo.wait_idle()
    assert await answer(repo, "o") == 3.0
    assert [(e[0], e[2]) for e in events.seen if e[1] == "o"] == [("loaded", "1")]
    assert "o: the compile of version 1 was stopped (its file was replaced)" in caplog.text
    key = cache_key(models_dir / "o.onnx", repo.config.model_defaults.compile, "cpu")
    entries = sorted(os.listdir(models_dir / ".cache"))
    assert [name for name in entries if name.endswith(".om")] == [f"o-{key[:32]}.om"]
    assert [name for name in entries if name.startswith(".")] == []  # no work folder nor lock


async def test_a_serving_model_deleted_while_its_new_file_compiles_ends_the_compile_and_unloads(
        make_repo, models_dir, model_files, compile_holds, caplog):
    """A reload's compile: the version serving the old file stays READY while it runs, then unloads
    as any deleted model does (it waited for the compile to end first)."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo()
    place(model_files[1]["onnx"], models_dir / "o.onnx")
    await until(lambda: any(compile_holds.iterdir()), "the first file's compile holding")
    (compile_holds / str(held_child(compile_holds))).unlink()
    await events.wait("loaded", "o")
    place(model_files[2]["onnx"], models_dir / "o.onnx")  # (by a rename: o is never gone meanwhile)
    await until(lambda: any(compile_holds.iterdir()), "the new file's compile holding")
    pid = held_child(compile_holds)
    assert rows_of(repo, "o") == [("READY", "")]
    (models_dir / "o.onnx").unlink()
    await until(lambda: not running(pid), "the new file's compile process ended")  # (it held to the end)
    await events.wait("unloaded", "o")
    await repo.wait_idle()
    assert rows_of(repo, "o") == []
    assert "o: the compile of version 1 was stopped (its file is gone)" in caplog.text
    assert "o: version 1 unloaded (its file is gone)" in caplog.text
    assert os.listdir(models_dir / ".cache") == []


async def test_a_file_deleted_while_its_load_waits_for_another_process_compiling_it_ends_the_wait(
        make_repo, models_dir, model_files, tmp_path, caplog):
    """Another process (a replica sharing the cache) compiles the same file: the wait for its
    lock ends, the other's lock untouched; it waited until the other compile let go."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    cache = tmp_path / "cache"
    cache.mkdir()
    repo, events = await make_repo(compile_cache_dir=str(cache))
    key = cache_key(model_files[2]["onnx"], repo.config.model_defaults.compile, "cpu")
    lock = cache / f".o-{key[:32]}.om.lock"
    with exclusive(lock):  # the replica's compile
        place(model_files[2]["onnx"], models_dir / "o.onnx")
        await until(lambda: rows_of(repo, "o") == [("LOADING", WAITING_ELSEWHERE)], "its wait said")
        (models_dir / "o.onnx").unlink()
        await until(lambda: rows_of(repo, "o") == [], "o gone from the index")  # (it waited for the lock)
        await repo.wait_idle()
        assert lock.exists()  # still the replica's
    # (nothing compiled for it: it was said "the compile of version 1 was stopped")
    assert "o: the load of version 1 was stopped while it waited for another compile of the same file (its file " \
           "is gone)" in caplog.text
    assert os.listdir(cache) == [] and repo.load_failures() == {} and events.count("load_failed", "o") == 0


async def test_a_file_replaced_while_it_loads_is_not_put_in_service(make_repo, models_dir, model_files,
                                                                     clean_faults, caplog):
    """Its load ended after the compile (here an .om: in its first warm-up run): the new file
    loads instead, the old one never serves."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo(load_concurrency=2)
    with held_run() as held:  # d's first warm-up run
        place(model_files[1]["om"], models_dir / "d.om")
        await until(held.entered.is_set, "d warming up")
        place(model_files[3]["om"], models_dir / "d.om")
        place(model_files[2]["om"], models_dir / "gate.om")
        await events.wait("loaded", "gate")  # the replacement has been scanned
    new = os.stat(models_dir / "d.om").st_ino
    await events.until(lambda: repo.serving_versions("d") and repo.get("d").wanted.file.inode == new)
    await repo.wait_idle()
    assert await answer(repo, "d") == 3.0
    assert [(e[0], e[2]) for e in events.seen if e[1] == "d"] == [("loaded", "1")]
    assert "d: version 1 not put in service: its file was replaced (changed while it loaded)" in caplog.text


async def version_2_compiling(make_repo, models_dir, model_files, compile_holds, caplog):
    """o/1 serving (scale 1), o/2 (scale 2, an .onnx) dropped in and held compiling: the repository,
    its events and the pid of the compile's child."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "o" / "1" / "model.om")
    repo, events = await make_repo()
    place(model_files[2]["onnx"], models_dir / "o" / "2" / "model.onnx")
    await until(lambda: any(compile_holds.iterdir()), "version 2's compile holding")
    return repo, events, held_child(compile_holds)


async def test_a_new_version_deleted_while_it_compiles_leaves_the_version_it_was_to_replace_serving(
        make_repo, models_dir, model_files, compile_holds, caplog):
    """Version 2's compile is stopped (its file is gone): version 1, which it was to replace, serves
    on (it was unloaded as `no longer selected`, the model unavailable until the safety rescan)."""
    repo, events, pid = await version_2_compiling(make_repo, models_dir, model_files, compile_holds, caplog)
    assert await answer(repo, "o") == 1.0
    (models_dir / "o" / "2" / "model.onnx").unlink()
    await until(lambda: not running(pid), "version 2's compile process ended")  # (it held until the test's end)
    await repo.wait_idle()
    assert await answer(repo, "o") == 1.0
    assert rows_of(repo, "o") == [("READY", "")]
    assert "o: the compile of version 2 was stopped (its file is gone)" in caplog.text
    assert "o: version 1 unloaded" not in caplog.text
    assert [(e[0], e[2]) for e in events.seen if e[1] == "o"] == [("loaded", "1")]
    assert repo.load_failures() == {} and os.listdir(models_dir / ".cache") == []


async def test_a_new_version_replaced_while_it_compiles_replaces_the_serving_one_only_once_it_loads(
        make_repo, models_dir, model_files, compile_holds, caplog):
    """Version 2's compile is stopped (its file was replaced): version 1 serves while the new file
    compiles (it was unloaded at the stop, the model serving nothing until the new file loaded),
    then the new file's version 2 takes its place."""
    repo, events, stale = await version_2_compiling(make_repo, models_dir, model_files, compile_holds, caplog)
    place(model_files[3]["onnx"], models_dir / "o" / "2" / "model.onnx")  # another model (scale 3) in its place
    await until(lambda: not running(stale), "the stale compile's process ended")
    (compile_holds / str(stale)).unlink()  # (the killed child's mark)
    await until(lambda: any(compile_holds.iterdir()), "the new file's compile holding")
    assert await answer(repo, "o") == 1.0
    assert rows_of(repo, "o") == [("READY", ""), ("LOADING", "compiling model.onnx for cpu")]
    (compile_holds / str(held_child(compile_holds))).unlink()
    await events.wait("unloaded", "o", "1")
    await repo.wait_idle()
    assert await answer(repo, "o") == 3.0
    assert [(e[0], e[2]) for e in events.seen if e[1] == "o"] == [
        ("loaded", "1"), ("unloading", "1"), ("loaded", "2"), ("unloaded", "1")]  # (the swap's order)
    assert "o: the compile of version 2 was stopped (its file was replaced)" in caplog.text
    assert "o: version 1 unloaded (version 2 took its place under its version_policy)" in caplog.text
    assert "no longer selected" not in caplog.text
