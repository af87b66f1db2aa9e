"""Poll mode: a dropped .onnx deleted once its compile has ended (its entry in the compile cache, made
here or by a replica sharing the cache) is not warmed up. Its load went on: checked the entry, opened
it, warmed it up and logged "o: version 1 ready" for a version that then never served ("not put in
service: its file is gone"), its cache entry removed only then (found by a helper, i108). Now the
load stops before its warm-up, whether a scan has seen the deletion (it stopped a compile already
ended) or not (the load looks at the file itself), and the entry goes as a dropped version's did;
an unload through the API arriving by then ends it alike (it was warmed up, swapped in, unloaded).
Real repository on the CPU runtime and its real watcher: the model's open held by a CPU-runtime
fault (`held_run`), a replica's compile by its entry's lock, the scans by `hold_folder_reads`."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil

import pytest

from aclserve.repository.compiler import WAITING_ELSEWHERE, compiled_om
from aclserve.repository.entry_locks import exclusive
from aclserve.repository.repository import ModelLoadFailed

from .repo_helpers import held_run, hold_folder_reads, place, until

pytestmark = pytest.mark.asyncio

STOPPED = "o: the load of version 1 was stopped before its warm-up (its file is gone)"


def rows_of(repo, name: str) -> list[tuple[str, str]]:
    return [(r["state"], r["reason"]) for r in repo.index() if r["name"] == name and r["version"]]


def compiles_in(cache) -> list[str]:
    return sorted(name for name in os.listdir(cache) if not name.endswith(".lock"))


async def test_a_file_deleted_while_its_compile_opens_is_not_warmed_up(make_repo, models_dir, model_files,
                                                                       clean_faults, caplog):
    """The scan that sees the deletion comes while the compile's OM opens on the device: the
    compile has ended, so the scan's stop reached nothing until the load looked before warming up."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo(load_concurrency=2)
    with held_run("load") as held:  # o's open (the compile runs in its own process: no load there)
        place(model_files[2]["onnx"], models_dir / "o.onnx")
        await until(held.entered.is_set, "o's compile opening")
        (models_dir / "o.onnx").unlink()
        place(model_files[3]["om"], models_dir / "gate.om")
        await events.wait("loaded", "gate")  # the deletion has been scanned (and o's load stopped)
    await repo.wait_idle()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("o: ")]
    assert STOPPED in said, said
    assert not [line for line in said if "ready" in line or "not put in service" in line], said
    assert rows_of(repo, "o") == [] and events.count("loaded", "o") == 0
    assert compiles_in(models_dir / ".cache") == [] and repo.load_failures() == {}


async def test_a_replicas_compile_of_a_file_deleted_meanwhile_is_not_warmed_up(make_repo, models_dir, model_files,
                                                                               tmp_path, caplog):
    """A replica sharing the cache compiled the file while this server's load waited for it; the file
    was deleted before any scan of this server saw it: the entry found, the load looks at its file."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    cache, replicas = tmp_path / "cache", tmp_path / "replica-cache"
    cache.mkdir()
    repo, events = await make_repo(compile_cache_dir=str(cache))
    made = compiled_om(model_files[2]["onnx"], "o", repo.config.model_defaults.compile, "cpu", replicas)
    with exclusive(cache / f".{made.name}.lock"):  # the replica's compile
        place(model_files[2]["onnx"], models_dir / "o.onnx")
        await until(lambda: rows_of(repo, "o") == [("LOADING", WAITING_ELSEWHERE)], "its wait said")
        reading, go_on = hold_folder_reads(repo)
        (models_dir / "o.onnx").unlink()
        for name in (made.name, f"{made.name}.json"):  # the replica's compile done
            shutil.copy(replicas / name, cache / name)
    await repo.wait_idle()
    go_on.set()
    await until(lambda: rows_of(repo, "o") == [], "o gone from the index")  # (the deletion's scan)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("o: ")]
    assert STOPPED in said, said
    assert not [line for line in said if "ready" in line or "not put in service" in line], said
    assert compiles_in(cache) == []  # (the entry of a file gone, as a dropped version's)
    assert events.count("loaded", "o") == 0 and repo.load_failures() == {}


async def test_an_unload_while_a_compile_opens_ends_its_load_before_the_warm_up(make_repo, models_dir, model_files,
                                                                               clean_faults, caplog):
    """Explicit mode: the unload's stop reached a compile already ended only now; the load was
    warmed up, said "ready", swapped in and then unloaded. The load call says an unload arrived."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    repo, events = await make_repo(model_control_mode="explicit")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    with held_run("load") as held:  # o's open
        load = asyncio.ensure_future(repo.load("o"))
        await until(held.entered.is_set, "o's compile opening")
        unload = asyncio.ensure_future(repo.unload("o"))
        await until(lambda: "o: unload asked through the repository API" in caplog.text, "the unload's stop")
    with pytest.raises(ModelLoadFailed, match="an unload request for it arrived during this load"):
        await load
    await unload
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("o: ")]
    assert "o: the load of version 1 was stopped before its warm-up (asked through the repository API)" in said, said
    assert not [line for line in said if "ready" in line], said
    assert rows_of(repo, "o") == [("UNAVAILABLE", "unloaded")]
    assert events.count("loaded", "o") == 0 and repo.load_failures() == {}
    assert len(compiles_in(models_dir / ".cache")) == 2  # (its file stays: its compile kept for the next load)
