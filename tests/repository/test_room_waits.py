"""Models past what a device holds wait for room there, quietly, and load when room is given back.

A tester (t95) served 200 tiny models on the CPU runtime: 56 loaded, 144 were refused for the
streams and events the others hold, and each was retried on the backoff's timer for good, logging
an INFO and a WARNING line at every retry (2,154 lines in 120 s, then ~290 a minute), though only
an unload on that device could make room. Now such a load waits for room on its device: tried again
when the device's ledger gets some back, in the order refused and only as many as fit, with a slow
fallback look that does nothing while the device is full. Real repository, CPU runtime; the device
allows 15 streams (its own 3 and 4 for each model of 1 instance x 2 slots: three models fit), set
on the runtime (ACLSERVE_CPU_MAX_STREAMS is read once per process)."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import weakref

import pytest

from aclserve.acl.cpu import faults
from aclserve.config import load_server_config
from aclserve.errors import ModelUnavailable
from aclserve.repository import ModelRepository
from aclserve.repository.room_waits import RoomWaits
from aclserve.runtime.limits import ResourceLimitError

from .repo_helpers import held_run, place, serving, until

pytestmark = pytest.mark.asyncio

WAITS = "(the device short of streams or events: waits for room on device 0, tried again as models there unload)"


@pytest.fixture
def runtime():
    """A CPU runtime whose device 0 holds three models of 1 instance x 2 slots (15 streams)."""
    from aclserve.runtime import AclRuntime
    rt = AclRuntime(device="cpu", device_limits=(15, None)).start()
    yield rt
    rt.close()


def reason_of(repo, name: str) -> tuple[str, str]:
    ((state, reason),) = [(r["state"], r["reason"]) for r in repo.index() if r["name"] == name]
    return state, reason


async def full_device(make_repo, models_dir, model_files, *waiting: str, **settings):
    """A repository (poll mode) serving a, b and c, which fill device 0, then refused `waiting`, in that order."""
    for name in "abc":
        place(model_files[1]["om"], models_dir / f"{name}.om")
    repo, events = await make_repo(readiness="strict", **settings)
    for name in waiting:
        place(model_files[1]["om"], models_dir / f"{name}.om")
        await events.wait("load_failed", name)
    return repo, events


def lines_of(caplog, name: str, level: int = logging.INFO) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name.startswith("aclserve") and r.levelno >= level and r.getMessage().startswith(f"{name}: ")]


async def test_loads_past_a_full_device_wait_without_a_retry_or_a_line(make_repo, models_dir, model_files, caplog):
    """Short retry settings (0.05 s to 0.2 s): over several of their periods each refused model has
    its one ERROR line, no WARNING or INFO after it, and no load retried (its fallback looks found
    the device still full, said at debug level only)."""
    caplog.set_level(logging.DEBUG, logger="aclserve")
    repo, _ = await full_device(make_repo, models_dir, model_files, "d", "e",
                                load_retry_initial_s=0.05, load_retry_max_s=0.2)

    def periods(name: str) -> int:  # the fallback's looks, or (before the room waits) the timer's retries
        looks = [r for r in caplog.records if r.getMessage() == f"{name}: version 1 still waits for room on device 0"]
        return len(looks) + repo.load_retries.get(name, 0)
    await until(lambda: all(periods(name) >= 3 for name in "de"), "three retry periods gone by")
    for name in "de":
        said = lines_of(caplog, name)
        assert [level for level, _ in said] == ["ERROR"], said
        assert said[0][1].endswith(WAITS), said
        assert repo.load_retries.get(name, 0) == 0
        assert reason_of(repo, name) == ("UNAVAILABLE", said[0][1].split(" not loaded: ", 1)[1])
    assert sorted(name for name, _ in repo.load_failures()) == ["d", "e"]  # (/metrics: still refused, as said)


@pytest.mark.parametrize("how", ["file deleted", "unload call"])
async def test_an_unload_loads_the_first_waiting_model_without_the_timer(make_repo, models_dir, model_files,
                                                                         caplog, how):
    """The retry timer set to an hour, only the room given back can load d: it does, at once, when a
    unloads (its file deleted in poll mode, or through the load API); e, refused after it, waits on
    (one model's room fits one model), not retried at all."""
    caplog.set_level(logging.INFO, logger="aclserve")
    repo, events = await full_device(make_repo, models_dir, model_files, "d", "e",
                                     load_retry_initial_s=3600, load_retry_max_s=3600)
    if how == "file deleted":
        (models_dir / "a.om").unlink()
    else:
        await repo.unload("a")
    await events.wait("loaded", "d", limit_s=60)  # (a hang guard: the timer's retry would come in an hour)
    await events.wait("unloaded", "a")
    assert reason_of(repo, "d") == ("READY", "")
    state, reason = reason_of(repo, "e")
    assert state == "UNAVAILABLE" and reason.endswith(WAITS), reason
    assert repo.load_retries == {"d": 1}
    assert ("INFO", "d: retrying the load of version 1 (device 0 has room again)") in lines_of(caplog, "d")
    assert not [line for line in lines_of(caplog, "e") if line[0] != "ERROR"]
    assert repo.not_serving() == ("1 model not serving: device 0 short of streams or events (e)", True)


async def test_a_retry_failing_as_the_last_one_said_is_not_said_again(make_repo, models_dir, model_files, caplog,
                                                                      clean_faults):
    """Any transient failure retried on the backoff's timer: a retry that fails as the last line said (the
    same reason, as /metrics labels it) is said at debug level, and so is the retry after it; the load
    that succeeds in the end is said. A device fault failing four loads in a row: one ERROR, one INFO
    for the first retry, and the INFO of its success, where each retry said an INFO and a WARNING."""
    caplog.set_level(logging.DEBUG, logger="aclserve")
    faults.inject("load", code=207001, count=4)  # (207001: out of device memory, transient)
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(load_retry_initial_s=0.05, load_retry_max_s=0.2)
    await events.wait("loaded", "m")
    assert repo.load_retries == {"m": 4}
    said = lines_of(caplog, "m")
    assert [level for level, _ in said] == ["ERROR", "INFO", "INFO"], said
    assert said[1][1] == "m: retrying the load of version 1" and said[2][1].startswith("m: version 1 ready"), said
    quiet = [text for level, text in lines_of(caplog, "m", logging.DEBUG) if level == "DEBUG"]
    assert len([text for text in quiet if text.startswith("m: version 1 not loaded, as before: ")]) == 3, quiet
    assert quiet.count("m: retrying the load of version 1") == 3, quiet


async def test_a_load_call_for_a_model_waiting_for_room_is_503_each_time(make_repo, models_dir, model_files):
    """A load call refused for room was 503 with Retry-After 1 s (no timer to count down), then 400
    for the same refusal (a reviewer, r38): it loads once room comes back whatever its count of
    refusals, so each call is 503, Retry-After its fallback look's due time."""
    for name in "abcd":
        place(model_files[1]["om"], models_dir / f"{name}.om")
    repo, _ = await make_repo(model_control_mode="explicit", load_retry_initial_s=3600, load_retry_max_s=3600)
    for name in "abc":
        await repo.load(name)
    for _ in range(2):
        with pytest.raises(ModelUnavailable) as refused:
            await repo.load("d")
        assert str(refused.value).endswith(WAITS), refused.value
        assert 1000 < refused.value.retry_after_s <= 3600, refused.value.retry_after_s


async def test_room_a_started_load_took_is_counted_once(make_repo, models_dir, model_files, clean_faults):
    """d, tried when a unloads, claims a's room and loads (its model's load from file held); b
    unloads: e fits the room b gave back and loads while d still loads (two load at once). A round
    counted d's need twice until its load ended (the room promised to it, and the ledger's claim):
    e waited for d's end."""
    repo, events = await full_device(make_repo, models_dir, model_files, "d", "e", load_concurrency=2,
                                     load_retry_initial_s=3600, load_retry_max_s=3600)
    with held_run("load") as model_load:
        await repo.unload("a")
        await asyncio.to_thread(model_load.entered.wait, 60)  # (d's claim taken: its model loads)
        assert model_load.entered.is_set()
        await repo.unload("b")
        await events.wait("loaded", "e", limit_s=60)
        assert not events.count("loaded", "d")  # (d still loads: held until the block ends)
    await events.wait("loaded", "d")
    assert serving(repo) == ["c", "d", "e"]


async def test_a_repository_never_closed_is_kept_neither_by_the_ledger_nor_by_its_loop(models_dir, model_files,
                                                                                       runtime, caplog):
    """A repository whose load waits for room listens to that device's ledger. Closed, it stops; one
    never closed (a library user's or a test's, dropped) left its listener on the ledger for good, and its
    fallback look, armed again at each look, kept it alive on its loop: collected now, the ledger
    forgets its listener. (The device is full with a claim of the test's own.)"""
    caplog.set_level(logging.DEBUG, logger="aclserve")
    ledger = runtime.device(0).ledger
    held = ledger.need(3, 2)  # (the whole device: 12 streams beside its own 3)
    ledger.claim(held, "the test's stand-in for three models")
    listening = len(ledger._listeners)
    place(model_files[1]["om"], models_dir / "d.om")
    settings = {"models_dir": str(models_dir), "model_control_mode": "explicit", "settle_s": 0,
                "load_retry_initial_s": 0.01, "load_retry_max_s": 0.02}
    try:
        for closed in (True, False):
            repo = ModelRepository(load_server_config(None, settings), runtime)
            await repo.start()
            with contextlib.suppress(ModelUnavailable):
                await repo.load("d")
            assert reason_of(repo, "d")[1].endswith(WAITS)
            assert len(ledger._listeners) == listening + 1
            if closed:
                await repo.close()
                assert len(ledger._listeners) == listening
                continue
            looked = "d: version 1 still waits for room on device 0"
            await until(lambda: looked in caplog.messages, "a fallback look (armed again after it)")
            dropped = weakref.ref(repo)
            del repo
            gc.collect()
            assert dropped() is None
    finally:
        ledger.release(held)  # (a give-back: the ledger forgets the listeners of what is gone)
    assert len(ledger._listeners) == listening


async def test_a_retry_that_loads_nothing_gives_its_room_back(make_repo, models_dir, model_files, runtime):
    """d and e wait for room on the full device; then d's file becomes its model's problem (a d/ folder beside
    d.om: the scan keeps its failure, as it cannot tell). a unloads: d, refused first, is tried again into a's
    room, promised to it on the ledger, but no plan loads a model the scan cannot serve: the promise stayed for
    good, every round counted it, and e, which fits a's room, waited for good (the timer set to an hour). Now
    d's room goes back once the reconcile plans nothing for it: e loads, and the ledger keeps nothing for d."""
    repo, events = await full_device(make_repo, models_dir, model_files, "d", "e",
                                     load_retry_initial_s=3600, load_retry_max_s=3600)
    place(model_files[1]["om"], models_dir / "d" / "1" / "model.om")
    await until(lambda: any(row["name"] == "d" and row["reason"].startswith("both d/ and a flat d.om")
                            for row in repo.index()), "d a problem of the scan")
    (models_dir / "a.om").unlink()
    await events.wait("loaded", "e", limit_s=60)  # (a hang guard: the timer's retry would come in an hour)
    assert serving(repo) == ["b", "c", "e"]
    await repo.unload("e")
    ledger, one = runtime.device(0).ledger, runtime.device(0).ledger.need(1, 2)
    assert ledger.fits(one) and ledger.room_for(one)  # (nothing promised to d: the room e left is free)


@contextlib.asynccontextmanager
async def _d_tried(runtime, busy=frozenset()):
    """Device 0 full with a claim of the test's own, model d refused there and waiting, then one model's
    room given back and d tried again (a RoomWaits whose retry loads nothing, its bound 0.05 s; `busy`: the
    models whose apply task runs): yields (the ledger, d's need)."""
    ledger = runtime.device(0).ledger
    held, one = ledger.need(3, 2), ledger.need(1, 2)
    ledger.claim(held, "the test's stand-in for three models")
    tried = []
    waits = RoomWaits(lambda: 0.05, lambda key, why: tried.append(why))
    waits.model_busy = busy.__contains__
    try:
        with pytest.raises(ResourceLimitError) as refused:
            ledger.claim(one, "model d (1 instance(s) x 2 slots)")
        waits.wait(("d", "1", ()), refused.value)
        ledger.release(one)
        await until(lambda: tried, "d tried again")
        yield ledger, one
    finally:
        waits.close()
        ledger.release(ledger.need(2, 2))


async def test_a_try_no_load_begins_gives_its_room_back_at_its_bound(runtime, caplog):
    """The backstop of a try whose load nothing says it begins nor ends (a retry that loads nothing, here
    the retry's call itself): once the bound (the fallback look's period) has passed, the room kept for it
    goes back, said at DEBUG level."""
    caplog.set_level(logging.DEBUG, logger="aclserve")
    async with _d_tried(runtime) as (ledger, one):
        await until(lambda: ledger.room_for(one), "the room kept for d back")
        assert "d: version 1, tried again for room on device 0, has not begun to load: its room goes back" in (
            caplog.messages)


async def test_a_try_of_a_busy_model_keeps_its_room_past_its_bound_until_its_task_ends(runtime):
    """A try whose model's apply task runs (it may compile another version for minutes; its end rescans the
    model, which begins the load or says it will not run) kept its room only to its bound: then that room went
    back, another load could take it, and this one was refused again once it began (a review's finding). It
    waits on while the model is busy, and its bound gives the room back once it is not."""
    busy = {"d"}
    async with _d_tried(runtime, busy) as (ledger, one):
        await asyncio.sleep(0.3)  # (six bounds)
        assert not ledger.room_for(one)  # (kept for d)
        busy.clear()
        await until(lambda: ledger.room_for(one), "the room kept for d back")
