"""model_control_mode: none refuses the repository API; explicit changes what serves only
through it, and a load call of a corrupt file or a bad config fails saying why, what served serving on."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aclserve.errors import InvalidInput, NotFound
from aclserve.repository import ModelLoadFailed, State

from .repo_helpers import answer, place

pytestmark = pytest.mark.asyncio


async def test_control_mode_none_refuses_the_api(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="none")
    with pytest.raises(InvalidInput, match="model_control_mode is none"):
        await repo.load("m")
    with pytest.raises(InvalidInput):
        await repo.unload("m")


async def test_explicit_mode_changes_only_through_the_api(make_repo, models_dir, model_files, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository.repository")
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(model_control_mode="explicit")
    assert await answer(repo, "m") == 1.0
    place(model_files[2]["om"], models_dir / "m.om")
    place(model_files[3]["om"], models_dir / "n.om")
    assert await answer(repo, "m") == 1.0  # no watcher in explicit mode
    with pytest.raises(NotFound):
        repo.get("n")
    await repo.load("m")
    assert await answer(repo, "m") == 2.0
    assert events.count("reloaded", "m") == 1
    await repo.load("n")
    assert await answer(repo, "n") == 3.0
    await repo.unload("m")
    with pytest.raises(NotFound, match="model m has no available versions"):  # as Triton: not a retry-later
        repo.get("m")
    # nor when it names a version (it was a 503: UNAVAILABLE "unloaded", which no wait changes)
    with pytest.raises(NotFound, match=r"^model m version 1 is not available \(unloaded through the repository API: "
                                       r"a load call serves it\)$"):
        repo.get("m", "1")
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert index[("m", "1")] == (State.UNAVAILABLE, "unloaded")
    await repo.load("m")
    assert await answer(repo, "m") == 2.0
    with pytest.raises(ModelLoadFailed, match="^failed to load absent: no model 'absent' in "):
        await repo.load("absent")
    with pytest.raises(InvalidInput):
        await repo.load("../etc")
    # the log says what the API asked (it said "version 1 unloaded" as for a deleted file)
    asked = [r.getMessage() for r in caplog.records if "through the repository API" in r.getMessage()]
    calls = (("m", "load"), ("n", "load"), ("m", "unload"), ("m", "load"), ("absent", "load"))
    assert asked == [f"{name}: {what} asked through the repository API" for name, what in calls]


async def test_api_load_of_a_corrupt_file_fails_and_keeps_serving(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    data = Path(model_files[2]["om"]).read_bytes()
    (models_dir / "m.om").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadFailed, match="truncated"):
        await repo.load("m")
    assert await answer(repo, "m") == 1.0
    (row,) = [r for r in repo.index() if r["name"] == "m"]
    assert row["state"] == State.READY and "truncated" in row["reason"]


async def test_api_load_of_a_model_with_a_bad_config_fails_and_names_the_config(make_repo, models_dir, model_files):
    """Its files are there (the index lists it): a load fails saying what is wrong with them (400
    over HTTP, as Triton's INVALID_ARG), not that the model is unknown, and an unload of it, with
    nothing serving, is done."""
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("instances: [oops\n")
    repo, _ = await make_repo(model_control_mode="explicit")
    with pytest.raises(ModelLoadFailed, match="failed to load m: .*m.yaml"):
        await repo.load("m")
    await repo.unload("m")
    with pytest.raises(NotFound, match="unknown model 'absent'"):
        await repo.unload("absent")
