"""Found by an operator's review of the repository and the CLI: each test pins one defect."""
from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from aclserve.repository import lifecycle
from aclserve.repository.repository import ModelLoadFailed

from .repo_helpers import serving, x_rows

pytestmark = pytest.mark.asyncio


async def test_a_load_overtaken_by_an_unload_says_so(make_repo, models_dir, model_files):
    """The unload arrives while the load is scanning: the model ends unloaded (the unload came
    last) and the load's answer names the unload instead of "no version loaded"."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    load, unload = await asyncio.gather(repo.load("m"), repo.unload("m"), return_exceptions=True)
    assert unload is None
    assert isinstance(load, ModelLoadFailed)
    assert "unload" in str(load)
    assert serving(repo) == []


async def test_a_load_behind_an_unload_loads_when_the_unload_is_done(make_repo, models_dir, model_files):
    """load, unload, load at once: the last word is a load, so the last load answers success and
    the model serves (explicit mode rescans nothing by itself: a dropped load would stay dropped).
    The first was overtaken by the unload and says so, as it does without the last load."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    first, unload, last = await asyncio.gather(repo.load("m"), repo.unload("m"), repo.load("m"),
                                               return_exceptions=True)
    assert unload is None and last is None
    assert isinstance(first, ModelLoadFailed) and "unload" in str(first), first
    await repo.wait_idle()
    assert serving(repo) == ["m"]
    assert repo.all_ready()


async def test_a_replacement_with_the_same_size_and_mtime_is_reloaded(make_repo, models_dir, model_files):
    """Reproducible builds and tar archives give every file the same mtime (SOURCE_DATE_EPOCH);
    two versions of a model often have the same size. Unpacking the new one over the old must
    serve the new one, not keep the old as if nothing changed."""
    assert os.path.getsize(model_files[1]["om"]) == os.path.getsize(model_files[2]["om"])
    epoch = (1_000_000_000, 1_000_000_000)
    target = models_dir / "m.om"
    shutil.copyfile(model_files[1]["om"], target)
    os.utime(target, epoch)
    repo, events = await make_repo()
    result = await repo.get("m").infer(x_rows(), 1)
    assert float(result.outputs["y"][0, 0]) == 1.0
    part = models_dir / "m.om.part"  # what tar does: write beside, set the archived mtime, rename
    shutil.copyfile(model_files[2]["om"], part)
    os.utime(part, epoch)
    os.replace(part, target)
    await events.wait("reloaded", "m", limit_s=30)
    result = await repo.get("m").infer(x_rows(), 1)
    assert float(result.outputs["y"][0, 0]) == 2.0


async def test_strict_readiness_counts_a_model_whose_config_is_broken(make_repo, models_dir, model_files):
    """A model file with a config that does not parse is in the repository and not serving (the
    index says UNAVAILABLE), so strict readiness is false, as for a model file that is junk."""
    shutil.copyfile(model_files[1]["om"], models_dir / "good.om")
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("max_batch_size: [\n")
    repo, _ = await make_repo(start=False, model_control_mode="explicit", readiness="strict")
    await repo.start()
    assert serving(repo) == ["good"]
    assert [r["state"] for r in repo.index() if r["name"] == "m"] == ["UNAVAILABLE"]
    assert not repo.all_ready()
    (models_dir / "m.yaml").write_text("slots: 1\n")
    await repo.load("m")
    assert serving(repo) == ["good", "m"] and repo.all_ready()


async def test_a_misplaced_versioned_model_file_is_named_in_the_index(make_repo, models_dir, model_files):
    """models/m/model.om (no version folder), models/n/v1/model.om, models/o/1/o.om: each a
    model the operator meant to serve; each shows in the index with what to change."""
    for path in ("m/model.om", "n/v1/model.om", "o/1/o.om", "p/1/model.om", "p/v2/model.om"):
        (models_dir / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_files[1]["om"], models_dir / path)
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["p"]
    rows = {r["name"]: r for r in repo.index() if r["version"] == ""}
    assert "m/model.om is not a version folder" in rows["m"]["reason"]
    assert "n/v1 is not a version folder" in rows["n"]["reason"]
    assert "o/1/o.om is not named model.om" in rows["o"]["reason"]
    assert "p" not in rows  # it serves version 1; the stray folder is only logged
    assert "m/<version>/model.om" in rows["m"]["reason"]


async def test_a_config_that_is_not_utf8_is_a_problem_of_its_model_only(make_repo, models_dir, model_files):
    """A model config saved in Latin-1 (an accented comment) is refused with its reason; the scan
    goes on, so the other models still reload."""
    shutil.copyfile(model_files[1]["om"], models_dir / "a.om")
    repo, events = await make_repo()
    shutil.copyfile(model_files[1]["om"], models_dir / "b.om.part")
    (models_dir / "b.yaml.part").write_bytes("# modèle\nslots: 1\n".encode("latin-1"))
    os.replace(models_dir / "b.yaml.part", models_dir / "b.yaml")  # in place, it would still be settling
    os.replace(models_dir / "b.om.part", models_dir / "b.om")
    shutil.copyfile(model_files[2]["om"], models_dir / "a.om.part")
    os.replace(models_dir / "a.om.part", models_dir / "a.om")
    await events.wait("reloaded", "a", limit_s=30)
    rows = {r["name"]: r for r in repo.index() if r["version"] == ""}
    assert "b.yaml" in rows["b"]["reason"] and "UTF-8" in rows["b"]["reason"]


async def test_a_load_that_meets_the_watchers_failing_load_names_the_files_error(make_repo, models_dir, monkeypatch):
    """Poll mode: load("m") arrives while the watcher's own task loads a junk m.om. The load
    waits for that task, and its answer says why the file does not load, not "no version
    loaded". The watcher's load is held at its start (a gate, no timing) to meet the call."""
    repo, _ = await make_repo()
    started, go = asyncio.Event(), asyncio.Event()
    real_load_version = lifecycle.load_version

    async def gated(*args, **kwargs):
        started.set()
        await go.wait()
        return await real_load_version(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "load_version", gated)
    (models_dir / ".m.om.part").write_bytes(b"not a model at all")
    os.replace(models_dir / ".m.om.part", models_dir / "m.om")
    await asyncio.wait_for(started.wait(), 30)  # a hang guard, not a timing check
    answer = asyncio.ensure_future(repo.load("m"))
    await asyncio.sleep(0)  # the load is waiting for the watcher's task
    go.set()
    with pytest.raises(ModelLoadFailed, match="version 1: not a loadable OM"):
        await asyncio.wait_for(answer, 30)


@pytest.mark.timeout(60)  # the old code spun the event loop for good here: the alarm ends it
async def test_waiting_for_a_model_whose_task_just_ended_yields_to_its_done_callback(make_repo, models_dir,
                                                                                       model_files):
    """A model's apply task had ended but its done callback, which takes it out of the busy
    set, had not run yet: wait_for awaited the ended task (shield hands it back as it is,
    without yielding) over and over, and the server hung, answering nothing (found by a
    helper's storm of load / unload calls). Here the task ends and its callback is queued
    behind the waiter, the moment that storm hit."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo()
    tasks = repo._lifecycle.tasks

    async def nothing():
        return {}

    task = asyncio.get_running_loop().create_task(nothing())
    tasks._busy["ghost"] = task
    task.add_done_callback(lambda t: tasks._finished("ghost", t))
    await asyncio.sleep(0)  # the task runs to its end; its done callback is queued behind us
    assert task.done() and "ghost" in tasks._busy
    await tasks.wait_for("ghost")
    assert "ghost" not in tasks._busy
    await repo.unload("m")  # the unload path waits the same way: still answered
    assert "m" not in serving(repo)
