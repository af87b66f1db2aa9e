"""A models folder that cannot be listed (its permissions taken away under a running server):
what serves and what the index knows stay, readiness is what it was, a retry falling due is kept,
load calls say why, and the folder listed again is seen at once."""
from __future__ import annotations

import asyncio

import pytest

from aclserve.errors import ModelUnavailable
from aclserve.repository import RepositoryError, State

from .repo_helpers import answer, place, serving, unlistable

pytestmark = pytest.mark.asyncio


async def test_a_models_folder_that_cannot_be_read_changes_and_forgets_nothing(make_repo, models_dir, model_files,
                                                                             monkeypatch):
    """Its permissions taken away under a running server (the tests run as root, who reads
    everything: listing it fails here by hand): what serves stays, and what is known of the
    files refused stays in the index, beside the folder's own problem."""
    place(model_files[1]["om"], models_dir / "good.om")
    (models_dir / "junk.om").write_bytes(b"this is not a model")
    repo, events = await make_repo(model_control_mode="none")
    unlistable(monkeypatch, models_dir)
    await asyncio.gather(*await repo._reconcile(trust="all"))
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert serving(repo) == ["good"] and await answer(repo, "good") == 1.0  # scale 1
    assert index[("junk", "1")][0] == State.UNAVAILABLE and "not a loadable OM" in index[("junk", "1")][1]
    assert "the models folder cannot be read (Permission denied)" in index[(str(models_dir), "")][1]
    monkeypatch.undo()
    await asyncio.gather(*await repo._reconcile(trust="all"))
    assert serving(repo) == ["good"] and events.count("load_failed", "junk") == 1  # not tried again


@pytest.mark.parametrize("readiness", ["strict", "lenient"])
async def test_readiness_is_what_it_was_while_the_models_folder_cannot_be_listed(
        make_repo, models_dir, model_files, monkeypatch, readiness):
    """Strict readiness said 503 while every model served on (the folder's own problem held it
    back); then, judged by a scan that lists nothing, it said 200 whatever held it back before,
    and for a folder never listed (found by an independent review). One that cannot be listed as
    the repository starts stops the start now (models_folder.py)."""
    place(model_files[1]["om"], models_dir / "good.om")
    repo, _ = await make_repo(model_control_mode="none", readiness=readiness)

    async def ready_after_a_scan(repo, listable: bool) -> bool:
        if not listable:
            unlistable(monkeypatch, models_dir)
        await asyncio.gather(*await repo._reconcile(trust="all"))
        monkeypatch.undo()
        return repo.all_ready()

    assert await ready_after_a_scan(repo, True) and await ready_after_a_scan(repo, False)
    place(model_files[1]["om"], models_dir / "broken.om")
    (models_dir / "broken.yaml").write_text("instances: [\n")  # a problem: holds strict readiness back
    broken, _ = await make_repo(start=False, model_control_mode="none", readiness=readiness)
    await broken.start()  # (none mode counts what its start found: a model added later is never loaded)
    held_back = readiness == "strict"
    assert await ready_after_a_scan(broken, True) is not held_back
    assert await ready_after_a_scan(broken, False) is not held_back
    unlistable(monkeypatch, models_dir)
    never, _ = await make_repo(start=False, model_control_mode="none", readiness=readiness)
    with pytest.raises(RepositoryError, match="cannot be read .Permission denied.: the user aclserve runs as needs"):
        await never.start()  # (it started, never listed, never ready: served as an empty folder)


async def test_a_models_folder_that_can_be_listed_again_is_seen_at_once(make_repo, models_dir, model_files,
                                                                       monkeypatch):
    """Its permissions given back send no file event: only the safety rescan (every 10 s) saw it
    (found by running the server on a folder chmod 000 and back). While a folder cannot be
    listed it is read again every second. The safety rescan is turned off here."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    repo, events = await make_repo()
    with monkeypatch.context() as patch:
        unlistable(patch, models_dir)
        place(model_files[1]["om"], models_dir / "late.om")  # its event's scan cannot list the folder
        for _ in range(600):  # (a hang guard)
            if any(r["name"] == str(models_dir) for r in repo.index()):
                break
            await asyncio.sleep(0.05)
        assert [r["reason"] for r in repo.index()] == ["the models folder cannot be read (Permission denied)"]
    await events.wait("loaded", "late", limit_s=30)  # (it waited for the safety rescan: an hour here)


@pytest.mark.parametrize("mode", ["explicit", "none"])
async def test_a_retry_due_while_the_models_folder_cannot_be_listed_is_not_lost(
        make_repo, models_dir, model_files, monkeypatch, clean_faults, mode):
    """Explicit and none modes read the folder only for a load or a retry: a retry whose scan
    could not list the folder planned nothing, and nothing tried again (found by an independent
    review)."""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("load", nth=1, code=207001)  # the first load fails: retried
    repo, events = await make_repo(start=False, model_control_mode=mode, load_retry_initial_s=0.2,
                                   load_retry_max_s=0.4)
    with monkeypatch.context() as patch:
        await repo.start()
        assert events.count("load_failed", "m") == 1
        unlistable(patch, models_dir)
        await asyncio.sleep(1.0)  # (an arrangement, not a check: the retry falls due meanwhile)
    await events.wait("loaded", "m", limit_s=30)  # (it waited for good)


async def test_the_load_api_while_the_models_folder_cannot_be_listed(make_repo, models_dir, model_files,
                                                                    monkeypatch):
    """A load said "no model 'good'" of a model serving; an unload of a refused model "unknown
    model" (found by an independent review): the folder cannot be read, which the load says;
    an unload goes by the folder as last listed."""
    place(model_files[1]["om"], models_dir / "good.om")
    (models_dir / "junk.om").write_bytes(b"this is not a model")
    repo, _ = await make_repo(model_control_mode="explicit")
    unlistable(monkeypatch, models_dir)
    with pytest.raises(ModelUnavailable, match=r"^cannot load good: the models folder cannot be read"):
        await repo.load("good")
    await repo.unload("junk")  # held out: readiness no longer waits for it
    assert serving(repo) == ["good"] and repo.all_ready()
