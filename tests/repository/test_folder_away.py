"""A models folder away for a moment, a release switch and back: what serves and what the
compile cache keeps (an independent tester's finds: `mv m2 m2.old; sleep 3; mv m2.old m2`
unloaded every model, deleted compiles and then compiled every .onnx again; a release switch
`models -> gen1` to gen2 deleted gen1's compile, whose .onnx was still there, and the rollback
compiled it again; the log said "removed the compile" where nothing was removed)."""
from __future__ import annotations

import asyncio
import logging
import os

import pytest

from .repo_helpers import place, x_rows

pytestmark = pytest.mark.asyncio


async def answer(repo, name: str) -> float:
    return float((await repo.get(name).infer(x_rows(), 1)).outputs["y"][0, 0])


def said(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


async def test_a_models_folder_moved_away_for_a_moment_changes_nothing_served(make_repo, models_dir, model_files,
                                                                              caplog):
    """Missing, it is as a folder that cannot be listed: nothing is known of it, so what serves
    serves on (not only for settle_s: a volume may take longer to come back), and once it is
    back nothing is loaded or compiled again; the log says it is back."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    folder = models_dir / "m2"
    place(model_files[1]["om"], folder / "a.om")
    place(model_files[2]["onnx"], folder / "o.onnx")
    repo, events = await make_repo(models_dir=str(folder))
    assert (await answer(repo, "a"), await answer(repo, "o")) == (1.0, 2.0)
    seen = len(events.seen)
    folder.rename(models_dir / "m2.old")
    await repo._reconcile(trust="settle")  # (what the watcher's scan does)
    assert [r for r in repo.index() if r.get("reason") == "the models folder does not exist"]
    await asyncio.sleep(repo.config.settle_s + 0.2)  # longer than any settle wait: still nothing changes
    await repo._reconcile(trust="settle")
    await repo.wait_idle()
    assert (await answer(repo, "a"), await answer(repo, "o")) == (1.0, 2.0)
    (models_dir / "m2.old").rename(folder)
    await repo._reconcile(trust="settle")
    await repo.wait_idle()
    assert events.seen[seen:] == []  # nothing unloaded, loaded or reloaded
    assert (await answer(repo, "a"), await answer(repo, "o")) == (1.0, 2.0)
    assert len(said(caplog, "o: compiling")) == 1 and said(caplog, "removed the compile") == []
    assert len(list((folder / ".cache").glob("o-*.om"))) == 1
    # its going and its coming back are each said once (the coming back was not said at all)
    assert said(caplog, f"models folder: {folder}: the models folder does not exist") != []
    assert said(caplog, "can be read again") == [f"models folder: {folder} can be read again"]


async def test_a_release_switch_keeps_the_compile_of_the_folder_switched_from(make_repo, models_dir, model_files,
                                                                              caplog):
    """`models -> gen1`, swapped to gen2, then back: gen1/o.onnx is still there, unchanged, so
    its compile stays and the rollback uses it."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[2]["onnx"], models_dir / "gen1" / "o.onnx")
    place(model_files[3]["onnx"], models_dir / "gen2" / "o.onnx")
    os.symlink("gen1", models_dir / "models")
    repo, events = await make_repo(models_dir=str(models_dir / "models"))
    assert await answer(repo, "o") == 2.0

    def switch_to(generation: str) -> None:  # atomically, as the README's release switch
        os.symlink(generation, models_dir / "models.new")
        os.replace(models_dir / "models.new", models_dir / "models")

    switch_to("gen2")
    await events.wait("reloaded", "o", limit_s=60)
    await repo.wait_idle()  # gen1's version drained and closed: its compile released
    assert await answer(repo, "o") == 3.0
    assert len(list((models_dir / "gen1" / ".cache").glob("o-*.om"))) == 1
    switch_to("gen1")
    await events.wait("reloaded", "o", count=2, limit_s=60)
    await repo.wait_idle()
    assert await answer(repo, "o") == 2.0
    compiled = said(caplog, "o: compiling")
    assert len(compiled) == 2 and "gen2" in compiled[1], compiled  # gen1's once, gen2's once
    assert said(caplog, f"using cached compile of {models_dir / 'gen1' / 'o.onnx'}")
    assert said(caplog, "removed the compile") == []


async def test_the_log_says_a_compile_was_removed_only_when_one_was(make_repo, models_dir, model_files, caplog):
    """A server sharing the cache removed the entry first (it retired the version too): this
    one's release finds nothing, and says nothing."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo, "o") == 2.0
    for path in (models_dir / ".cache").glob("o-*"):  # the other server's removal
        path.unlink()
    (models_dir / "o.onnx").unlink()
    await repo.unload("o")
    assert said(caplog, "unloaded") and said(caplog, "removed the compile") == []
