"""Load calls arriving together share a scan of the folder: each rescanned it under the scan
lock, so loading every model of a 300-model folder took 44 s (O(N^2)), whatever
load_concurrency said (found by an independent check of the repository at scale). Load calls
of one bad model made together each say why it failed."""
from __future__ import annotations

import asyncio

import pytest

from aclserve.repository import State
from aclserve.repository.repository import ModelLoadFailed

from .repo_helpers import answer, count_folder_reads, held_run, hold_folder_reads, place, until

pytestmark = pytest.mark.asyncio


async def test_load_calls_made_together_share_the_scans(make_repo, models_dir, model_files):
    names = [f"m{i}" for i in range(12)]
    for name in names:
        place(model_files[1]["om"], models_dir / f"{name}.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    for name in names:
        await repo.unload(name)
    scans = count_folder_reads(repo)
    await asyncio.gather(*(repo.load(name) for name in names))
    assert {r["name"]: r["state"] for r in repo.index()} == {name: State.READY for name in names}
    assert scans[0] < len(names), scans[0]  # (one each before; here about 2: the first, then the rest)


async def test_a_load_sees_a_file_placed_before_it_was_asked(make_repo, models_dir, model_files):
    """A load after a change still scans: only a scan begun after the call is reused."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[2]["om"], models_dir / "m.om")
    await repo.load("m")
    assert await answer(repo, "m") == 2.0


@pytest.mark.parametrize("mode", ["explicit", "poll"])
async def test_load_calls_of_a_bad_model_made_together_each_say_why(make_repo, models_dir, mode):
    """Each call forgets the model's refused files, to try them again: forgotten before it waited
    for the scan lock, a load task of another call ending meanwhile refused them again, and the
    call answered "no version loaded" (found by an independent check)."""
    repo, _ = await make_repo(model_control_mode=mode)
    (models_dir / "bad.om").write_bytes(b"garbage" * 100)
    for _ in range(3):
        outcomes = await asyncio.gather(*(repo.load("bad") for _ in range(3)), return_exceptions=True)
        for outcome in outcomes:
            assert isinstance(outcome, ModelLoadFailed), outcome
            assert str(outcome) == "failed to load bad: version 1: not an OM file (neither a CPU OM nor an ATC 'IMOD' header)"


async def test_index_calls_made_together_share_one_read_of_the_folder(make_repo, models_dir, model_files):
    """In explicit mode the index reads the folder itself (a model copied in after the start was
    missing from it until a load call read the folder): calls made together share one scan, and
    what it finds is listed, not loaded."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    scans = count_folder_reads(repo)
    place(model_files[2]["om"], models_dir / "later.om")
    answers = await asyncio.gather(*(repo.index_now() for _ in range(20)))
    assert scans[0] == 1
    for rows in answers:
        assert {(r["name"], r["state"], r["reason"]) for r in rows} == {("m", "READY", ""),
                                                                         ("later", "UNAVAILABLE", "not loaded")}
    await repo.wait_idle()
    assert repo.serving_versions("later") == []


async def test_an_index_read_goes_on_when_its_caller_leaves(make_repo, models_dir, model_files):
    """A client that drops its index call (the server cancels the handler) does not stop the read:
    stopped, it freed the scan lock while its scan's thread ran on, and a client sending calls and
    dropping them could have scans run side by side without end."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    reading, go_on = hold_folder_reads(repo)
    place(model_files[2]["om"], models_dir / "later.om")
    call = asyncio.ensure_future(repo.index_now())
    await asyncio.wait_for(reading.wait(), 30)  # (a hang guard)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert repo._scan_lock.locked()  # its read holds the folder's scan on
    go_on.set()
    assert ("later", "UNAVAILABLE") in {(r["name"], r["state"]) for r in await repo.index_now()}


async def test_index_reads_are_paced_by_the_scans_before_them(make_repo, models_dir, model_files):
    """A client calling the index in a loop would keep a thread scanning the folder: a read begins
    no sooner than four times the last scan's duration (at least 0.1 s) after it ended, and a call
    arriving while a scan runs waits for its end, then for that pace (it would have scanned again
    at once). The clock and the pauses are the test's: no time passes."""
    now = [1000.0]
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit", clock=lambda: now[0])
    slept = []

    async def sleep(seconds):
        slept.append(round(seconds, 6))
        now[0] += seconds
    repo._index_reads._sleep = sleep
    reading, go_on = asyncio.Event(), asyncio.Event()
    scans = [0]
    rescan = repo._planner.rescan

    async def two_seconds():
        scans[0] += 1
        now[0] += 2.0
        reading.set()
        await go_on.wait()
        return await rescan()
    repo._planner.rescan = two_seconds
    go_on.set()
    await repo.index_now()  # the start's scan took no time: 0.1 s after it
    await repo.index_now()  # 4 x 2 s after the last one ended
    assert (slept, scans[0]) == ([0.1, 8.0], 2)
    reading.clear()
    go_on.clear()
    now[0] += 100  # (the pace is over)
    first = asyncio.ensure_future(repo.index_now())
    await asyncio.wait_for(reading.wait(), 30)  # (a hang guard)
    second = asyncio.ensure_future(repo.index_now())  # arrives while the first one's scan runs
    await asyncio.sleep(0)
    go_on.set()
    await asyncio.gather(first, second)
    assert (slept, scans[0]) == ([0.1, 8.0, 8.0], 4)


async def test_a_load_call_whose_caller_leaves_still_loads_the_model(make_repo, models_dir, model_files):
    """A load call cancelled while its version warms up (the server cancels the handler of a
    client that goes away: `curl -m 1`): the cancellation reached the model's task through the
    call's gather and abandoned the load, which left the model LOADING for good (a reviewer).
    The model's task is the repository's, not the caller's: it loads to the end."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.unload("m")
    with held_run() as warmup:  # the load's first warm-up run waits
        call = asyncio.ensure_future(repo.load("m"))
        await until(warmup.entered.is_set, "the warm-up began")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await repo.wait_idle()
    assert {r["name"]: r["state"] for r in repo.index()} == {"m": State.READY}
    assert await answer(repo, "m") == 1.0
