"""A version on disk that is not loaded says why, and a request for it is told whether a retry
may help (found by an independent tester): in explicit mode one no load call named is a 404
(only a load call would serve it; a 503 with Retry-After was answered for good); in poll mode
a model held unloaded by an API unload says so when new files come; a version waiting for its
config edit to settle says it waits for the config, not for its own file."""
from __future__ import annotations

import os
import re

import pytest

from aclserve.errors import NotFound
from aclserve.repository.status import HELD

from .repo_helpers import place, write_in, x_rows
from .test_folder_changes import FakeClock

pytestmark = pytest.mark.asyncio


def rows(repo, name: str) -> dict[str, tuple[str, str]]:
    return {r["version"]: (r["state"], r["reason"]) for r in repo.index() if r["name"] == name}


async def answer(repo, name: str, version: str | None = None) -> float:
    return float((await repo.get(name, version).infer(x_rows(), 1)).outputs["y"][0, 0])


async def test_explicit_mode_a_model_no_load_call_named_is_not_found(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[2]["om"], models_dir / "newm.om")
    await repo.load("m")  # reads the folder again: newm is listed, not loaded
    assert rows(repo, "newm") == {"1": ("UNAVAILABLE", "not loaded")}
    said = re.escape("is not loaded (model_control_mode explicit: a load call serves it)")
    with pytest.raises(NotFound, match=rf"^model newm {said}$"):
        repo.get("newm")
    with pytest.raises(NotFound, match=rf"^model newm version 1 {said}$"):
        repo.get("newm", "1")
    await repo.load("newm")
    assert await answer(repo, "newm") == 2.0


async def test_explicit_mode_a_version_a_config_edit_selects_is_not_found_until_loaded(
        make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "e" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "e" / "2" / "model.om")
    write_in(models_dir / "e" / "config.yaml", "version_policy: {specific: [1]}\n")
    place(model_files[3]["om"], models_dir / "other.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    write_in(models_dir / "e" / "config.yaml", "version_policy: all\n")
    await repo.load("other")
    with pytest.raises(NotFound, match=r"^model e version 2 is not loaded \(model_control_mode explicit"):
        repo.get("e", "2")
    assert await answer(repo, "e") == 1.0
    await repo.load("e")
    assert await answer(repo, "e", "2") == 2.0


async def test_poll_mode_a_new_file_of_a_model_unloaded_through_the_api_says_what_holds_it(
        make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "a.om")
    repo, events = await make_repo()
    await repo.unload("a")
    assert rows(repo, "a") == {"1": ("UNAVAILABLE", "unloaded")}
    os.unlink(models_dir / "a.om")
    place(model_files[3]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")  # the deletion scanned: the record "unloaded" goes with the file
    place(model_files[2]["om"], models_dir / "a.om")
    place(model_files[3]["om"], models_dir / "gate2.om")
    await events.wait("loaded", "gate2")
    assert rows(repo, "a") == {"1": ("UNAVAILABLE", HELD)}
    assert "unloaded through the repository API (a load call serves it)" in HELD
    with pytest.raises(NotFound, match=r"model a has no available versions \(unloaded\)"):
        repo.get("a")
    with pytest.raises(NotFound, match="a load call serves it"):  # (not a 503 to retry: only a load call)
        repo.get("a", "1")
    await repo.load("a")
    assert await answer(repo, "a") == 2.0


async def test_a_version_waiting_for_its_config_edit_to_settle_says_so(make_repo, models_dir, model_files):
    """The config written in place settles (the settle gate's clock is a fake one, moved on by
    the test); the version it newly selects is complete itself."""
    clock = FakeClock()
    place(model_files[1]["om"], models_dir / "e" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "e" / "2" / "model.om")
    write_in(models_dir / "e" / "config.yaml", "version_policy: {specific: [1]}\n")
    for path in ("1/model.om", "2/model.om", "config.yaml"):
        os.utime(models_dir / "e" / path, (100, 100))  # old: taken by the first scan
    repo, events = await make_repo(clock=clock, settle_s=1)  # (1000 - 0.3 on the fake clock is not 999.7 apart)
    (models_dir / "e" / "config.yaml").write_text("version_policy: all\n")  # in place: it settles
    place(model_files[3]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")
    assert rows(repo, "e") == {"1": ("READY", ""), "2": ("UNAVAILABLE", "waiting for its config file to be complete")}
    clock.now += 2.0
    place(model_files[3]["om"], models_dir / "gate2.om")
    await events.wait("loaded", "e", "2")
    assert rows(repo, "e") == {"1": ("READY", ""), "2": ("READY", "")}
