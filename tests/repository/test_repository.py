"""ModelRepository on the real runtime and CPU runtime: layouts, control modes, index, errors."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from aclserve.errors import InvalidInput, ModelUnavailable, NotFound, ShuttingDown
from aclserve.repository import ModelLoadFailed, RepositoryError, State
from aclserve.repository.served import auto_slots

from .repo_helpers import place, serving, x_rows
from .test_scan import unlistable

pytestmark = pytest.mark.asyncio


async def answer(repo, name, version=None, rows=1):
    result = await repo.get(name, version).infer(x_rows(rows), rows)
    return float(result.outputs["y"][0, 0])


async def test_start_loads_both_layouts_and_serves(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "flat.om")
    place(model_files[2]["om"], models_dir / "multi" / "1" / "model.om")
    place(model_files[3]["om"], models_dir / "multi" / "2" / "model.om")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == ["flat", "multi"]
    assert repo.all_ready()
    assert await answer(repo, "flat") == 1.0
    assert await answer(repo, "multi") == 3.0  # latest 1
    served = repo.get("multi")
    assert (served.version, served.max_batch_size, served.gears) == ("2", 4, (1, 2, 4))
    assert [len(i.slots) for i in served.pool.instances] == [auto_slots("cpu")]  # slots: auto
    assert [s.name for s in served.inputs] == ["x"] and [s.name for s in served.outputs] == ["y"]
    with pytest.raises(NotFound):
        repo.get("nope")
    with pytest.raises(NotFound):
        repo.get("flat", "7")
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert index[("flat", "1")] == (State.READY, "")
    assert index[("multi", "2")] == (State.READY, "")
    assert index[("multi", "1")] == (State.UNAVAILABLE, "not selected by the version policy")
    with pytest.raises(NotFound, match="^model multi version 1 is not selected by its version_policy$"):
        repo.get("multi", "1")  # (it said "has no version 1", the index "not selected")
    assert {(r["name"], r["version"]) for r in repo.index(ready_only=True)} == {("flat", "1"), ("multi", "2")}
    assert {e[0] for e in events.seen} == {"loaded"}
    assert all(e[3]["seconds"] > 0 for e in events.seen)


async def test_version_policy_all_serves_each_version(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\nbatching: {max_queue_delay_ms: 0}\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert await answer(repo, "m", "1") == 1.0
    assert await answer(repo, "m", "2") == 2.0
    assert await answer(repo, "m") == 2.0
    assert repo.get("m", "2").config.batching.max_queue_delay_ms == 0


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


async def test_slots_auto_is_one_on_a_cpu_runtime_confined_to_one_core(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "flat.om")
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})  # as under `taskset -c N aclserve serve`
    try:
        repo, _ = await make_repo(model_control_mode="none")
        slots = [len(i.slots) for i in repo.get("flat").pool.instances]
        assert auto_slots("cpu") == 1 and auto_slots("npu") == 2
    finally:
        os.sched_setaffinity(0, saved)
    assert slots == [1]
    assert await answer(repo, "flat") == 1.0
    if len(saved) >= 2:
        assert auto_slots("cpu") == 2


async def test_slots_from_a_model_file_win_over_auto(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "two.om")
    (models_dir / "two.yaml").write_text("slots: 2\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert [len(i.slots) for i in repo.get("two").pool.instances] == [2]
    assert await answer(repo, "two") == 1.0


async def test_bad_files_on_disk_show_in_the_index(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "good.om")
    (models_dir / "junk.om").write_bytes(b"this is not a model")
    (models_dir / "badcfg.om").write_bytes(Path(model_files[1]["om"]).read_bytes())
    (models_dir / "badcfg.yaml").write_text("slots: 0\n")
    (models_dir / "bad name.om").write_bytes(b"x")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == ["good"]
    assert repo.all_ready()  # lenient: refused files show in the index but do not hold readiness back
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert index[("junk", "1")][0] == State.UNAVAILABLE and "not a loadable OM" in index[("junk", "1")][1]
    assert "slots: must be >= 1" in index[("badcfg", "")][1]
    assert index[("bad name.om", "")][0] == State.UNAVAILABLE
    assert events.count("load_failed", "junk") == 1
    # refused for good (no retry is due): 404, as Triton's "has no available versions", not a
    # 503 a client would retry forever
    with pytest.raises(NotFound, match=r"model junk has no available versions \(.*not a loadable OM"):
        repo.get("junk")
    with pytest.raises(NotFound, match=r"model junk version 1 is not available \(.*not a loadable OM"):
        repo.get("junk", "1")
    # so is a model whose files cannot be served as they are (its config broken): it was a 503
    # without a version, and "unknown model" with one, though the index lists it (a helper)
    with pytest.raises(NotFound, match=r"model badcfg has no available versions \(.*slots: must be >= 1"):
        repo.get("badcfg")
    with pytest.raises(NotFound, match=r"model badcfg version 1 is not available \(.*slots: must be >= 1"):
        repo.get("badcfg", "1")


async def test_a_version_on_disk_not_loaded_yet_is_unavailable_not_unknown(make_repo, models_dir, model_files):
    """A version folder the scan found and the policy selects, still settling: the index lists it
    UNAVAILABLE, and a request naming it is told so (503, retry later), not 404 "no version"
    as for a version that does not exist."""
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    for path in (models_dir / "m" / "1" / "model.om", models_dir / "m" / "config.yaml"):
        os.utime(path, (1, 1))  # old files: taken at once at start
    repo, _ = await make_repo(model_control_mode="poll", settle_s=30)
    (models_dir / "m" / "2").mkdir()
    (models_dir / "m" / "2" / "model.om").write_bytes(Path(model_files[2]["om"]).read_bytes())  # written in place
    for _ in range(3000):  # a hang guard, not a timing
        if any(r["version"] == "2" for r in repo.index()):
            break
        await asyncio.sleep(0.01)
    (row,) = [r for r in repo.index() if r["version"] == "2"]
    assert (row["state"], row["reason"]) == (State.UNAVAILABLE, "waiting for the file to be complete")
    # (the index's reason, which a request was not told: "not loaded", test_settling_request_reason.py)
    with pytest.raises(ModelUnavailable, match=r"model m version 2 is not ready \(UNAVAILABLE: waiting for the file"):
        repo.get("m", "2")
    with pytest.raises(NotFound, match="model m has no version 3"):
        repo.get("m", "3")
    assert await answer(repo, "m", "1") == 1.0


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


async def test_symlink_outside_the_repository_is_never_loaded(make_repo, models_dir, model_files, tmp_path):
    os.symlink(model_files[1]["om"], models_dir / "escape.om")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == []
    # refused: the start's one failed load of the model (problem_loads.py), nothing loaded
    assert [(event, name, version) for event, name, version, _ in events.seen] == [("load_failed", "escape", "")]
    assert any(r["name"] == "escape" and "outside" in r["reason"] for r in repo.index())


async def test_dropped_onnx_is_compiled_cached_and_served(make_repo, models_dir, model_files, runtime, caplog):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / "o.yaml").write_text("compile: {batch: [1, 2]}\n")
    caplog.set_level(logging.INFO, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo, "o") == 2.0
    assert repo.get("o").gears == (1, 2)
    cached = sorted(os.listdir(models_dir / ".cache"))
    assert len(cached) == 2 and cached[0].endswith(".om") and cached[1] == cached[0] + ".json"  # + manifest
    compiling = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]  # one line, not two
    assert compiling == [f"o: compiling {models_dir / 'o.onnx'} for cpu into {models_dir / '.cache' / cached[0]}"]
    await repo.close()
    caplog.clear()
    repo2, _ = await make_repo(model_control_mode="explicit")  # same content + options: cache hit
    assert await answer(repo2, "o") == 2.0
    assert sorted(os.listdir(models_dir / ".cache")) == cached
    assert any("using cached compile" in r.getMessage() for r in caplog.records)
    assert not any(r.getMessage().endswith("(ATC not used)") for r in caplog.records)


async def test_om_beside_onnx_wins(make_repo, models_dir, model_files):
    place(model_files[2]["onnx"], models_dir / "m.onnx")
    place(model_files[3]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="none")
    assert await answer(repo, "m") == 3.0
    assert not (models_dir / ".cache").exists()


async def test_close_is_idempotent_and_frees_device_memory(make_repo, models_dir, model_files, runtime):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(model_control_mode="none")
    used_loaded = runtime.memory(refresh=True)[0]["used"]
    await repo.close()
    await repo.close()
    assert runtime.memory(refresh=True)[0]["used"] < used_loaded
    assert events.count("unloaded", "m") == 1
    with pytest.raises(ShuttingDown):
        repo.get("m")


async def test_missing_models_folder_fails_start(make_repo, tmp_path):
    from aclserve.repository import RepositoryError
    with pytest.raises(RepositoryError, match="does not exist"):
        await make_repo(models_dir=str(tmp_path / "nope"))


async def test_start_says_whether_the_folder_is_empty_or_its_files_are_still_settling(
        make_repo, models_dir, model_files, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository.repository")
    await make_repo()  # nothing in the folder
    assert "holds no model" in caplog.text and "still being written" not in caplog.text
    caplog.clear()
    written = time.time()
    (models_dir / "m.om").write_bytes(Path(model_files[3]["om"]).read_bytes())  # fresh: not trusted yet
    await make_repo(wall_clock=lambda: written)  # (fresh however late it starts) waits until m is served
    assert "still being written" in caplog.text and "holds no model" not in caplog.text


@pytest.mark.parametrize("names, listed", [(["m"], "m"),
                                           ([f"m{i}" for i in range(7)], "m0, m1, m2, m3, m4 and 2 more")])
async def test_start_says_the_folder_holds_models_it_refused_not_that_it_holds_none(
        make_repo, models_dir, model_files, caplog, names, listed):
    """digits.om beside a digits.yaml naming a labels file that is missing: "holds no model" was
    said of a folder holding one, refused (tester t51). Past five the line said "m0, ..., m4, ..."
    where every other list of names says how many more."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.repository")
    for name in names:
        place(model_files[1]["om"], models_dir / f"{name}.om")
        (models_dir / f"{name}.yaml").write_text("outputs:\n  y: {labels: missing_labels.txt}\n")
    await make_repo(wall_clock=lambda: time.time() + 60)  # (files a minute old: trusted at once)
    assert "holds no model" not in caplog.text
    assert (f"the models folder {models_dir} holds {len(names)} model(s) it cannot serve as they are ({listed}: each "
            "one's reason is logged above and in the repository index); the server is up but has nothing to "
            "serve") in caplog.text


async def test_answers_are_right_for_every_gear(make_repo, models_dir, model_files):
    place(model_files[3]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="none")
    for rows in (1, 2, 3, 4):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        result = await repo.get("m").infer({"x": x}, rows)
        np.testing.assert_array_equal(result.outputs["y"], x * 3)


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


async def test_a_max_batch_size_above_the_largest_gear_is_said(make_repo, models_dir, model_files, caplog):
    """Served as the largest gear (4 here), as before, but no longer in silence (an operator's check).
    An .om's sizes were fixed by ATC: the note told its owner "compile.batch sets the sizes", and
    its config's `compile:` was passed over in silence (an audit's findings): said once. The model's
    own max_batch_size (its requests of more rows refused) in a WARNING, model_defaults' at INFO."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("batching:\n  max_batch_size: 100\ncompile: {batch: [1, 2, 8]}\n")
    place(model_files[1]["om"], models_dir / "inherits.om")
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.batching.max_batch_size": 50})
    assert repo.get("m").max_batch_size == 4
    said = [r.getMessage() for r in caplog.records]
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    fixed = "(an .om's batch sizes were fixed when it was compiled: ATC's --dynamic_batch_size)"
    assert levels.get("m:1: batching.max_batch_size 100 is above the largest compiled batch size 4: a batch holds 4 "
                      f"rows at most, and a request of more is refused {fixed}") == "WARNING", said
    assert levels.get("inherits:1: batching.max_batch_size 50 (model_defaults', or --max-batch) is above the "
                      "largest compiled batch size 4: a batch holds 4 rows at most, and a request of more is refused "
                      f"{fixed}") == "INFO", said
    assert ("models folder: m.yaml: compile is ignored for m.om: an .om was compiled already (its batch sizes "
            "were fixed by ATC); compile applies to an .onnx the server compiles") in said, said
    assert not [line for line in said if "compile.batch" in line]
