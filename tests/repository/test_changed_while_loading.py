"""What changes on disk while a version loads is looked at when its load ends, before the swap
(poll mode, real watcher, real CPU runtime; found by an independent tester): a version deleted,
or no longer selected by its version_policy, meanwhile never serves, and the version it was to
replace serves on. Before, it went live, retired the good version and served until the safety
rescan (10 s) loaded that one again. The load is held in its first warm-up run by a CPU-runtime
fault (a watchdog lets it go after 30 s: a hang guard); a file dropped after the change is a gate
that the change has been scanned."""
from __future__ import annotations

import logging
import shutil

import pytest

from aclserve.errors import NotFound

from .repo_helpers import held_run, hold_folder_reads, place, until, write_in, x_rows

pytestmark = pytest.mark.asyncio


def version_rows(repo, name: str) -> dict[str, tuple[str, str]]:
    return {r["version"]: (r["state"], r["reason"]) for r in repo.index() if r["name"] == name}


def moves_of(events, name: str, since: int) -> list[tuple[str, str]]:
    """What happened to `name`'s versions after the first `since` events (the start's loads)."""
    return [(e[0], e[2]) for e in events.seen[since:] if e[1] == name]


async def answer(repo, name: str) -> float:
    return float((await repo.get(name).infer(x_rows(), 1)).outputs["y"][0, 0])


async def test_a_version_deleted_while_it_loads_never_serves_and_the_one_serving_stays(
        make_repo, models_dir, model_files, clean_faults, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "e" / "1" / "model.om")
    repo, events = await make_repo(load_concurrency=2)
    started = len(events.seen)
    with held_run() as held:  # version 2's first warm-up run
        place(model_files[2]["om"], models_dir / "e" / "2" / "model.om")
        await until(held.entered.is_set, "version 2 warming up")
        shutil.rmtree(models_dir / "e" / "2")
        place(model_files[3]["om"], models_dir / "gate.om")
        await events.wait("loaded", "gate")  # the deletion has been scanned
    await repo.wait_idle()
    assert moves_of(events, "e", started) == []  # version 1 neither unloaded nor reloaded, 2 never in service
    assert await answer(repo, "e") == 1.0
    assert version_rows(repo, "e") == {"1": ("READY", "")}
    assert "e: version 2 not put in service: its file is gone (changed while it loaded)" in caplog.text


async def test_a_new_model_deleted_while_it_loads_never_becomes_ready(make_repo, models_dir, model_files,
                                                                      clean_faults):
    repo, events = await make_repo(load_concurrency=2)
    started = len(events.seen)
    with held_run() as held:  # d's first warm-up run
        place(model_files[1]["om"], models_dir / "d.om")
        await until(held.entered.is_set, "d warming up")
        (models_dir / "d.om").unlink()
        place(model_files[3]["om"], models_dir / "gate.om")
        await events.wait("loaded", "gate")
    await repo.wait_idle()
    assert moves_of(events, "d", started) == []
    with pytest.raises(NotFound, match="unknown model 'd'"):
        repo.get("d")
    assert version_rows(repo, "d") == {}


async def test_a_version_deleted_before_any_scan_saw_it_never_serves(make_repo, models_dir, model_files,
                                                                     clean_faults):
    """The load ends before the watcher's scan has seen the deletion (the scans are held): its
    file is looked at itself."""
    place(model_files[1]["om"], models_dir / "e" / "1" / "model.om")
    repo, events = await make_repo()
    started = len(events.seen)
    with held_run() as held:
        place(model_files[2]["om"], models_dir / "e" / "2" / "model.om")
        await until(held.entered.is_set, "version 2 warming up")
        reading, go_on = hold_folder_reads(repo)
        shutil.rmtree(models_dir / "e" / "2")
    await repo.wait_idle()  # (a scan is no part of the load's end)
    go_on.set()
    await repo.wait_idle()
    assert moves_of(events, "e", started) == []
    assert await answer(repo, "e") == 1.0


async def test_a_version_the_policy_no_longer_selects_when_its_load_ends_never_serves(
        make_repo, models_dir, model_files, clean_faults, caplog):
    """Pinned back (`specific: [1]`) while version 2 loads: version 1 serves on, as it is (its new
    policy taken without a reload), and 2 never serves."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "e" / "1" / "model.om")
    repo, events = await make_repo(load_concurrency=2)
    started = len(events.seen)
    one = repo.get("e", "1")
    with held_run() as held:
        place(model_files[2]["om"], models_dir / "e" / "2" / "model.om")
        await until(held.entered.is_set, "version 2 warming up")
        write_in(models_dir / "e" / "config.yaml", "version_policy: {specific: [1]}\n")
        place(model_files[3]["om"], models_dir / "gate.om")
        await events.wait("loaded", "gate")
    await until(lambda: repo.get("e").config.version_policy == ("specific", (1,)), "the new policy taken")
    await repo.wait_idle()
    assert moves_of(events, "e", started) == []
    assert repo.get("e") is one and await answer(repo, "e") == 1.0
    assert version_rows(repo, "e") == {"1": ("READY", ""), "2": ("UNAVAILABLE", "not selected by the version policy")}
    assert "e: version 2 not put in service: no longer selected by its version_policy (changed while it loaded)" \
        in caplog.text
