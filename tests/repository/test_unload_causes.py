"""Each unload says why, in the log line and in the index while the version drains (found by an
operator's tester: "version N unloaded" alike for an API call, a file deleted, a version policy or
the server stopping)."""
from __future__ import annotations

import asyncio
import logging
import os

import pytest


from .repo_helpers import held_run, place, until, write_in, x_rows

pytestmark = pytest.mark.asyncio


def row(repo, name: str, version: str = "1") -> tuple[str, str]:
    return next((r["state"], r["reason"]) for r in repo.index() if r["name"] == name and r["version"] == version)


def unload_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if " unloaded (" in r.getMessage()]



async def test_an_api_unload_says_why_while_it_drains_and_after(make_repo, models_dir, model_files, clean_faults,
                                                                 caplog):
    """The index showed UNLOADING without a reason and the log "version 1 unloaded", as for a
    deleted file or a version policy. Once drained it is UNAVAILABLE "unloaded", as Triton says."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.lifecycle")
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    with held_run() as held:  # a request in flight holds the drain
        request = asyncio.ensure_future(repo.get("m").infer(x_rows(), 1))
        await until(held.entered.is_set, "running")
        unload = asyncio.ensure_future(repo.unload("m"))
        await until(lambda: row(repo, "m")[0] == "UNLOADING", "unloading")
        assert row(repo, "m") == ("UNLOADING", "asked through the repository API")
    await asyncio.gather(request, unload)
    assert row(repo, "m") == ("UNAVAILABLE", "unloaded")  # drained: Triton's words, which clients match
    assert unload_lines(caplog) == ["m: version 1 unloaded (asked through the repository API)"]


async def test_each_unload_of_the_folder_says_why(make_repo, models_dir, model_files, caplog):
    """A newer version taking over, a version policy that no longer selects the version, a file
    deleted, the server stopping: each said only "version N unloaded"."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.lifecycle")
    place(model_files[1]["om"], models_dir / "v" / "1" / "model.om")
    place(model_files[1]["om"], models_dir / "gone.om")
    repo, events = await make_repo()  # poll mode
    place(model_files[2]["om"], models_dir / "v" / "2" / "model.om")
    await events.wait("unloaded", "v", "1")
    write_in(models_dir / "v" / "config.yaml", "version_policy: {specific: [1]}\n")
    await events.wait("unloaded", "v", "2")
    os.unlink(models_dir / "gone.om")
    await events.wait("unloaded", "gone")
    assert unload_lines(caplog) == ["v: version 1 unloaded (version 2 took its place under its version_policy)",
                                    "v: version 2 unloaded (no longer selected by its version_policy)",
                                    "gone: version 1 unloaded (its file is gone)"]
    await repo.close()
    assert unload_lines(caplog)[3:] == ["v: version 1 unloaded (the server is shutting down)"]


async def test_a_version_policy_edit_alone_says_its_policy_dropped_the_version(make_repo, models_dir, model_files,
                                                                                clean_faults, caplog):
    """An edit of version_policy alone (specific [1, 2] -> [1, 3]) keeps 1 serving, loads 3 and
    drops 2: 2 goes because the policy no longer selects it, not because 3 "took its place"
    (that is a newer file under an unchanged policy), in the index while it drains and in the log."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.lifecycle")
    for version in (1, 2, 3):
        place(model_files[version]["om"], models_dir / "p" / str(version) / "model.om")
    write_in(models_dir / "p" / "config.yaml", "version_policy: {specific: [1, 2]}\n")
    repo, events = await make_repo()
    with held_run() as held:  # a request in flight on version 2 holds its drain
        request = asyncio.ensure_future(repo.get("p", "2").infer(x_rows(), 1))
        await until(held.entered.is_set, "running")
        write_in(models_dir / "p" / "config.yaml", "version_policy: {specific: [1, 3]}\n")
        await until(lambda: row(repo, "p", "2")[0] == "UNLOADING", "unloading")
        assert row(repo, "p", "2") == ("UNLOADING", "no longer selected by its version_policy")
    await request
    await events.wait("unloaded", "p", "2")
    assert unload_lines(caplog) == ["p: version 2 unloaded (no longer selected by its version_policy)"]
    assert "p: its new version_policy keeps version 1 serving as it is (not reloaded)" in caplog.text


async def test_an_api_unload_during_a_failing_load_says_it_was_asked(make_repo, models_dir, model_files,
                                                                     clean_faults, caplog):
    """Version 1 serves, version 2 is dropped in and its load fails, an API unload came meanwhile:
    version 1 goes with the plan the failed load leaves (the unload finds nothing of its own to
    do), and was said to go "no longer selected by its version_policy" (an independent review)."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.lifecycle")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    repo, events = await make_repo()
    with held_run("load", code=500001) as held:  # version 2's load, which then fails
        place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
        await until(held.entered.is_set, "loading")
        unload = asyncio.ensure_future(repo.unload("m"))
        await until(lambda: "m" in repo._lifecycle.held, "held")
    await unload
    await events.wait("unloaded", "m", "1")
    assert unload_lines(caplog) == ["m: version 1 unloaded (asked through the repository API)"]
