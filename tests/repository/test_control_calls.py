"""The repository API's load and unload calls as clients see them (found by an operator's tester):
a model being loaded says LOADING from the moment the load is asked, and a load overtaken by an
unload answers so whatever comes after the unload."""
from __future__ import annotations

import asyncio
import logging

import pytest

from aclserve.errors import ModelUnavailable, NotFound
from aclserve.repository import ModelLoadFailed

from .repo_helpers import held_run, hold_folder_reads, place, serving, until
from .test_unload_causes import row, unload_lines

pytestmark = pytest.mark.asyncio


async def test_a_model_whose_load_is_asked_is_loading_from_the_call_on(make_repo, models_dir, model_files):
    """Until the load's task began (the call reads the folder first), a request naming no version
    was told "not ready (UNAVAILABLE: unloaded)" and the index said so: looked at on every turn of
    the loop while the call runs, the model is LOADING each time until it serves."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.unload("m")
    load = asyncio.ensure_future(repo.load("m"))
    seen, pinned = [], []
    while not load.done():
        await asyncio.sleep(0)
        try:
            repo.get("m")
            answer = "serving"
        except ModelUnavailable as e:  # (503 with Retry-After over HTTP, UNAVAILABLE over gRPC)
            answer = e.message
        seen.append((answer, row(repo, "m")))
        try:  # a version named: the same 503 while the load runs, not the 404 of a model held unloaded
            repo.get("m", "1")
        except ModelUnavailable as e:
            pinned.append(e.message)
    await load
    assert pinned and all(said.startswith("model m version 1 is not ready (LOADING") for said in pinned), pinned
    loading = [s for s in seen if s[0] != "serving"]
    said_loading = [s[1][0] == "LOADING" and s[0].startswith("model m is not ready (LOADING") for s in loading]
    assert loading and all(said_loading), sorted(set(seen))
    assert loading[0] == ("model m is not ready (LOADING: load asked through the repository API: reading the models "
                          "folder)", ("LOADING", "load asked through the repository API: reading the models folder"))
    assert row(repo, "m") == ("READY", "")


async def test_a_load_overtaken_by_an_unload_says_so_though_a_later_load_came(make_repo, models_dir, model_files,
                                                                               clean_faults, caplog):
    """load, an unload while it loads, another load: the first load answered 200 because the third
    call cleared the unload's mark before the first looked (without the third: 400). Each answers
    for itself in the order they came: the first was overtaken, the unload and the last load did
    what they said (the unload's log line says it was asked, though the mark is gone), and the
    model serves."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.lifecycle")
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.unload("m")
    with held_run() as held:  # the first load's first warm-up run
        first = asyncio.ensure_future(repo.load("m"))
        await until(held.entered.is_set, "loading")
        unload = asyncio.ensure_future(repo.unload("m"))
        last = asyncio.ensure_future(repo.load("m"))
        await asyncio.sleep(0)  # both arrive (each waits for the first load's task from its first step)
    first, unload, last = await asyncio.gather(first, unload, last, return_exceptions=True)
    assert isinstance(first, ModelLoadFailed) and "an unload request for it arrived during this load" in str(first)
    assert unload is None and last is None
    await repo.wait_idle()
    assert serving(repo) == ["m"]
    assert unload_lines(caplog) == ["m: version 1 unloaded (asked through the repository API)"] * 2


async def test_a_load_overtaken_while_it_reads_the_folder_no_longer_shows_loading(make_repo, models_dir,
                                                                                   model_files):
    """An unload that arrives while a load call still reads the folder wins: the model is
    unloaded at once (nothing of it serves), and its version must say so, not LOADING for as
    long as the overtaken call runs. The call's read of the folder is held by an event."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.unload("m")
    reading, go_on = hold_folder_reads(repo)
    load = asyncio.ensure_future(repo.load("m"))
    try:
        await asyncio.wait_for(reading.wait(), 30)  # a hang guard
        assert row(repo, "m") == ("LOADING", "load asked through the repository API: reading the models folder")
        await repo.unload("m")
        assert row(repo, "m") == ("UNAVAILABLE", "unloaded")
        with pytest.raises(NotFound, match=r"^model m version 1 is not available \(unloaded through the repository "
                                           r"API: a load call serves it\)$"):  # (the load call fails: 404)
            repo.get("m", "1")
    finally:
        go_on.set()
    with pytest.raises(ModelLoadFailed, match="an unload request for it arrived during this load"):
        await load
    assert serving(repo) == [] and row(repo, "m") == ("UNAVAILABLE", "unloaded")


async def test_an_unload_overtaking_the_first_load_of_a_new_model_is_not_a_404(make_repo, models_dir, model_files):
    """A model added after the last scan, its load call reading the folder, then an unload (an
    independent review): the unload answered 404 "unknown model" (no scan had listed it) and the
    load then served it, against the calls' order. The unload now overtakes the load as for a
    model already listed. The call's read of the folder is held by an event."""
    place(model_files[1]["om"], models_dir / "a.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[1]["om"], models_dir / "n.om")
    reading, go_on = hold_folder_reads(repo)
    load = asyncio.ensure_future(repo.load("n"))
    try:
        await asyncio.wait_for(reading.wait(), 30)  # a hang guard
        await repo.unload("n")
    finally:
        go_on.set()
    with pytest.raises(ModelLoadFailed, match="an unload request for it arrived during this load"):
        await load
    assert serving(repo) == ["a"]
    with pytest.raises(NotFound):  # a model no load call reads the folder for is unknown, as before
        await repo.unload("never")


async def test_an_unload_of_a_made_up_name_keeps_nothing_once_its_load_call_is_cancelled(
        make_repo, models_dir, model_files):
    """The unload arriving while the load of a name no model has reads the folder is taken (the load
    may find it) and marks the name; a load call cancelled then (its client gone: aiohttp cancels
    the handler) never found that it is no model, and the mark stayed for good. The last load call
    of a name nothing knows leaves nothing of it, however it ends. The call's read is held by an event."""
    place(model_files[1]["om"], models_dir / "a.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    reading, go_on = hold_folder_reads(repo)
    load = asyncio.ensure_future(repo.load("ghost"))
    try:
        await asyncio.wait_for(reading.wait(), 30)  # a hang guard
        await repo.unload("ghost")
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load
    finally:
        go_on.set()
    assert (repo._calls._last_unload, repo._lifecycle.held, repo._calls.asked) == ({}, set(), {"a"})
    with pytest.raises(NotFound, match="unknown model 'ghost'"):
        await repo.unload("ghost")


async def test_an_explicit_start_of_one_model_loads_it_alone(make_repo, models_dir, model_files):
    """start(only=...), `aclserve profile`'s: the folder's other models are listed, not loaded, until
    a load call names one (profile loaded and warmed up every model of its folder to profile one)."""
    place(model_files[1]["om"], models_dir / "a.om")
    place(model_files[2]["om"], models_dir / "b.om")
    repo, _ = await make_repo(start=False, model_control_mode="explicit")
    await repo.start(only="a")
    assert (row(repo, "a"), row(repo, "b")) == (("READY", ""), ("UNAVAILABLE", "not loaded"))
    assert repo.all_ready()  # (what was asked serves)
    await repo.load("b")
    assert row(repo, "b") == ("READY", "")
    with pytest.raises(ValueError, match="explicit mode"):
        await (await make_repo(start=False))[0].start(only="a")
