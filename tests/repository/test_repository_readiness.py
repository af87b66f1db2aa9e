"""The repository's readiness (all_ready), strict and lenient: what each control mode counts,
a model loading, added later or still settling, and a transient failure's retry still to come."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from aclserve.errors import ModelUnavailable
from aclserve.repository import ModelLoadFailed, State

from .repo_helpers import answer, place, serving

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("readiness", ["strict", "lenient"])
async def test_explicit_mode_is_ready_with_what_it_was_asked_to_serve(make_repo, models_dir, model_files, readiness):
    """A load call rescans the folder: a model staged in it (or a broken one) made the server
    not ready for good, though nothing would load it unless asked (an operator's check). As
    Triton: readiness counts the models loaded at start and those the API named since."""
    place(model_files[1]["om"], models_dir / "m.om")
    place(model_files[2]["om"], models_dir / "d.om")
    repo, _ = await make_repo(model_control_mode="explicit", readiness=readiness)
    assert repo.all_ready()
    place(model_files[3]["om"], models_dir / "staged.om")
    (models_dir / "broken.yaml").write_text("instances: [\n")
    place(model_files[1]["om"], models_dir / "broken.om")
    await repo.load("d")
    assert {r["name"] for r in repo.index()} >= {"staged", "broken"}  # (the load rescanned the folder)
    assert repo.all_ready()
    await repo.load("staged")
    assert repo.all_ready() and await answer(repo, "staged") == 3.0
    with pytest.raises(ModelLoadFailed):
        await repo.load("broken")  # named now: its problem holds readiness back in strict mode
    assert repo.all_ready() == (readiness == "lenient")


async def test_none_mode_is_ready_with_what_it_loaded_at_start(make_repo, models_dir, model_files, clean_faults):
    """A transient load failure's retry rescans the folder: a model staged meanwhile held strict
    readiness back for good, though none mode never loads it (a second review)."""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("execute", nth=1, count=2)  # the warm-up fails: retried, and the retry rescans
    repo, events = await make_repo(start=False, model_control_mode="none", readiness="strict",
                                   load_retry_initial_s=0.2, load_retry_max_s=0.5)
    await repo.start()
    place(model_files[2]["om"], models_dir / "staged.om")
    await events.wait("loaded", "m", limit_s=30)
    assert {r["name"] for r in repo.index()} >= {"m", "staged"} and repo.all_ready()


async def test_explicit_mode_a_model_loading_through_the_api_holds_strict_readiness(make_repo, models_dir,
                                                                                   model_files, clean_faults):
    """As Triton's: a model asked for and still loading is not ready yet (a third review found
    it counted only once loaded: an ATC compile of minutes said ready throughout)."""
    import threading

    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit", readiness="strict")
    place(model_files[2]["om"], models_dir / "n.om")
    gate = threading.Event()
    fault = faults.inject("execute", nth=1, hold=gate)  # n's warm-up waits
    load = asyncio.create_task(repo.load("n"))
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, fault.entered.wait, 30)
        assert not repo.all_ready()
    finally:
        gate.set()
        await load
    assert repo.all_ready()


async def test_explicit_mode_counts_no_load_of_no_model(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit", readiness="strict")
    with pytest.raises(ModelLoadFailed):  # (no such model: a failed load, 400 as Triton's)
        await repo.load("ghost")
    place(model_files[2]["om"], models_dir / "ghost.om")  # staged later: nobody asked for it since
    await repo.load("m")
    assert repo.all_ready()
    os.unlink(models_dir / "m.om")  # a model the start loaded, gone: its load is a 400, and it is no longer waited for
    with pytest.raises(ModelLoadFailed):
        await repo.load("m")
    place(model_files[1]["om"], models_dir / "m.om")
    await repo.load("ghost")  # (any load rescans)
    assert repo.all_ready() and "m" not in serving(repo)


async def test_strict_readiness_waits_for_every_model_on_disk(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "good.om")
    (models_dir / "junk.om").write_bytes(b"this is not a model")
    repo, _ = await make_repo(start=False, model_control_mode="explicit", readiness="strict")
    await repo.start()  # explicit mode: returns once every file has loaded or failed
    assert serving(repo) == ["good"] and not repo.all_ready()  # junk should be served and is not
    assert "not a loadable OM" in repo.load_failures()[("junk", "1")]
    await repo.unload("junk")  # unloaded on purpose: no longer expected
    assert repo.all_ready()


@pytest.mark.parametrize("readiness", ["strict", "lenient"])
async def test_a_model_added_later_holds_back_strict_readiness_only(make_repo, models_dir, model_files, clean_faults,
                                                                  readiness):
    """Replicas sharing a folder all see a model dropped into it: lenient readiness, once reached,
    stays while it loads (an ATC compile takes minutes; every replica would leave its balancer);
    strict readiness waits for it, as Triton's. Reached whether or not anyone asked meanwhile
    (it was latched by a probe's question: a replica not asked between its start and the drop
    left its balancer; a review). A model no instance can run still turns both off
    (tests/server/test_server_readiness.py), and so does closing."""
    import threading
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "good.om")
    os.utime(models_dir / "good.om", (100, 100))  # old: loaded by the start
    repo, events = await make_repo(start=False, readiness=readiness)
    await repo.start()  # (readiness not asked here before the drop)
    assert serving(repo) == ["good"]
    release = threading.Event()
    faults.inject("load", hold=release, count=1)  # the next model load waits for the test
    try:
        place(model_files[1]["om"], models_dir / "late.om")
        for _ in range(12000):  # a hang guard: until its load has begun (no event says so)
            if any(r["name"] == "late" and r["state"] == State.LOADING for r in repo.index()):
                break
            await asyncio.sleep(0.01)
        assert [r["state"] for r in repo.index() if r["name"] == "late"] == [State.LOADING]
        assert repo.all_ready() is (readiness == "lenient")
    finally:
        release.set()
    await events.wait("loaded", "late")
    assert serving(repo) == ["good", "late"] and repo.all_ready()
    await repo.close()
    assert not repo.all_ready()


@pytest.mark.parametrize("readiness", ["strict", "lenient"])
async def test_a_model_still_settling_at_start_holds_readiness_back(make_repo, models_dir, model_files, readiness):
    """A file written just before start is not trusted until it has not changed for settle_s;
    meanwhile readiness is false, in both modes."""
    written = time.time()
    (models_dir / "m.om").write_bytes(Path(model_files[3]["om"]).read_bytes())  # fresh: not trusted yet
    # the first scan's wall clock stays at the write: a loaded machine may start settle_s after
    # it, and the file, old enough by then, was taken at once. settle_s 0.3 s, not make_repo's
    # 0.1 s: the file settles after the start has returned, not during a start a loaded machine slows
    repo, events = await make_repo(start=False, readiness=readiness, wall_clock=lambda: written, settle_s=0.3)
    await repo.start()
    ready_at_start = repo.all_ready()
    await events.until(repo.all_ready)
    assert not ready_at_start
    assert await answer(repo, "m") == 3.0  # the settled file (scale 3) serves


async def test_lenient_readiness_waits_for_a_retry_still_to_come(make_repo, models_dir, model_files, clean_faults):
    """`readiness: lenient` lets a file refused for good stop holding readiness back, not one
    whose automatic retry (a transient device error) is still to come: the model may serve in a
    moment, as one still loading may (it was ready while the retry waited)."""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("execute", nth=1, count=2)  # the first warm-up run and its re-run fail 507011: transient, retried
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=1.0,
                                   load_retry_max_s=2.0)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == State.UNAVAILABLE and "transient device error: retry 1 in" in row["reason"]
    assert not repo.all_ready()
    with pytest.raises(ModelUnavailable, match="transient device error"):  # a retry is due: 503, retry later
        repo.get("m")
    await events.wait("loaded", "m")
    assert repo.all_ready()


async def test_lenient_readiness_comes_when_a_retry_has_failed_again(make_repo, models_dir, model_files, clean_faults):
    """Retries go on until the file loads (a device too small for the model fails with an
    out-of-memory code, transient, for good): lenient readiness held back for every retry was
    never ready. Only the first retry still to come holds it back. (Reached, that is: with no model
    serving the server is not ready all the same, test_server_readiness.py.)"""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("execute", code=207001)  # device memory allocation failed, on every run
    repo, _ = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=0.2,
                              load_retry_max_s=0.4)
    await repo.start()

    def reached() -> bool:
        return repo._readiness.reached
    assert not reached()  # its first retry is still to come
    for _ in range(1000):  # a hang guard, not a timing
        if reached():
            break
        await asyncio.sleep(0.01)
    assert reached() and not repo.all_ready()  # (m, the one model, serves not)
    # and stays so while the later retries load (each went back to not ready for its load), also
    # as each fails, while its load task has not ended yet (a window the polling below may miss)
    retries = repo.load_retries.get("m", 0)
    seen, at_failure = set(), []
    repo.add_listener(lambda event, *_, **__: event == "load_failed" and at_failure.append(reached()))
    for _ in range(1000):  # a hang guard, not a timing: until three more retries have run
        seen.add(reached())
        if repo.load_retries.get("m", 0) >= retries + 3:
            break
        await asyncio.sleep(0.005)
    assert seen == {True} and repo.load_retries.get("m", 0) >= retries + 3
    assert at_failure and all(at_failure), at_failure
    for _ in range(1000):  # between two retries (one may be loading now, or just due: "not loaded" as it
        (row,) = repo.index()  # is taken up; one CI run looked then)
        if row["state"] == State.UNAVAILABLE and "transient device error: retry" in row["reason"]:
            break
        await asyncio.sleep(0.005)
    assert row["state"] == State.UNAVAILABLE and "transient device error: retry" in row["reason"]
