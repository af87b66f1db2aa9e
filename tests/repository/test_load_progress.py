"""A version loading shows its current step as its reason in the repository index: waiting for
its turn (load_concurrency), compiling, opening, each warm-up run, and how long so far once the
step is long. The warm-up is held here by a CPU-runtime fault on its first execution (a watchdog
lets it go after 30 s: a hang guard)."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from aclserve.config import CompileOptions
from aclserve.om import compile_process
from aclserve.repository.compiler import WAITING_ELSEWHERE, WAITING_HERE, cache_key, compiled_om
from aclserve.repository.entry_locks import exclusive
from aclserve.repository.control_calls import LOAD_ASKED

from .repo_helpers import held_run, http_index, place, started_on_old_files, until


def reasons(repo) -> dict[str, tuple[str, str]]:
    return {row["name"]: (row["state"], row["reason"]) for row in repo.index() if row["version"]}



@pytest.mark.asyncio
async def test_the_index_names_the_warm_up_run_and_the_versions_waiting_their_turn(
        make_repo, models_dir, model_files, clean_faults):
    repo, _ = await make_repo(model_control_mode="explicit", load_concurrency=1)
    place(model_files[1]["om"], models_dir / "a.om")
    place(model_files[2]["om"], models_dir / "b.om")
    with held_run() as held:  # the first warm-up run of the first load
        first = asyncio.ensure_future(repo.load("a"))
        await until(held.entered.is_set, "held")
        second = asyncio.ensure_future(repo.load("b"))
        await until(lambda: reasons(repo).get("b", ("", ""))[1].startswith("waiting"), "waiting")
        assert reasons(repo)["a"] == ("LOADING", "warming up: gear 1, run 1 of 3")  # gears 1, 2, 4
        assert reasons(repo)["b"] == ("LOADING", "waiting: other versions are loading (load_concurrency)")
    await asyncio.gather(first, second)
    assert reasons(repo) == {"a": ("READY", ""), "b": ("READY", "")}


@pytest.mark.asyncio
async def test_of_the_versions_a_start_loads_together_those_behind_say_they_wait(
        make_repo, models_dir, model_files, clean_faults):
    """Started in the same turn of the loop (a start's plans): the first takes the turn at once, so
    the next sees it taken and says it waits, rather than its first step ("checking b.om")."""
    repo, _ = await make_repo(start=False, model_control_mode="explicit", load_concurrency=1)
    place(model_files[1]["om"], models_dir / "a.om")
    place(model_files[2]["om"], models_dir / "b.om")
    with held_run() as held:  # the first warm-up run of the first load
        starting = asyncio.ensure_future(repo.start())
        await until(held.entered.is_set, "held")
        shown = reasons(repo)
    await starting
    assert shown == {"a": ("LOADING", "warming up: gear 1, run 1 of 3"),
                     "b": ("LOADING", "waiting: other versions are loading (load_concurrency)")}, shown


@pytest.mark.asyncio
async def test_a_reload_of_a_serving_version_shows_no_steps(make_repo, models_dir, model_files, clean_faults,
                                                            caplog):
    """The version serves on while its new file loads: READY without a reason throughout (a step
    shown would move a READY version back to LOADING, which the states refuse)."""
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[1]["om"], models_dir / "a.om")
    await repo.load("a")
    place(model_files[2]["om"], models_dir / "a.om")  # scale 2 replaces scale 1
    with held_run() as held:  # the new file's first warm-up run
        reload = asyncio.ensure_future(repo.load("a"))
        await until(held.entered.is_set, "held")
        assert reasons(repo)["a"] == ("READY", "")
    await reload
    x = np.ones((1, 4), np.float32)
    assert float((await repo.get("a").infer({"x": x}, 1)).outputs["y"][0, 0]) == 2.0  # the new file serves
    assert reasons(repo)["a"] == ("READY", "")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.asyncio
async def test_a_version_has_a_reason_from_the_moment_it_is_loading(make_repo, models_dir, model_files, tmp_path):
    """Its LOADING reason was empty until its first step was said, for as long as hashing a large
    .onnx (or checking a large .om) took. Held here before that step ends as a replica sharing the
    compile cache holds it: compiling the same file (its cache entry's lock), which the reason then
    says (it said it was looking in the cache for as long as the other compile took)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    repo, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(cache))
    place(model_files[1]["onnx"], models_dir / "a.onnx")
    key = cache_key(models_dir / "a.onnx", repo.config.model_defaults.compile, "cpu")
    with exclusive(cache / f".a-{key[:32]}.om.lock"):  # another replica compiling a.onnx
        load = asyncio.ensure_future(repo.load("a"))
        await until(lambda: reasons(repo).get("a", ("", LOAD_ASKED))[1] != LOAD_ASKED, "its load began")
        first = reasons(repo)["a"]
        await until(lambda: reasons(repo)["a"][1] == WAITING_ELSEWHERE, "its wait said")
    await load
    assert first in (("LOADING", "looking for the compile of a.onnx in the compile cache"),
                     ("LOADING", WAITING_ELSEWHERE))
    assert reasons(repo) == {"a": ("READY", "")}


def test_a_compile_says_so_and_a_cache_hit_says_nothing(model_files, tmp_path):
    steps: list[str] = []
    onnx = Path(model_files[1]["onnx"])
    first = compiled_om(onnx, "m", CompileOptions(batch=(1, 2)), "cpu", tmp_path, progress=steps.append)
    again = compiled_om(onnx, "m", CompileOptions(batch=(1, 2)), "cpu", tmp_path, progress=steps.append)
    assert first == again and first.is_file()
    assert steps == [f"compiling {onnx.name} for cpu"]


@pytest.mark.asyncio
async def test_in_poll_mode_a_file_dropped_while_another_model_loads_is_not_held_back_by_it(
        make_repo, models_dir, model_files, clean_faults):
    """The watcher's reconcile starts each model's task and returns: it used to wait for them,
    so while one model loaded (a long compile, a slow warm-up) no other file change of the
    folder was even scanned (the index did not list a model dropped meanwhile) and
    load_concurrency above 1 served nothing dropped after the first file."""
    repo, events = await make_repo(model_control_mode="poll", load_concurrency=2)
    with held_run() as held:  # the first warm-up run of a
        place(model_files[1]["om"], models_dir / "a.om")
        await until(held.entered.is_set, "held")
        place(model_files[2]["om"], models_dir / "b.om")
        await until(lambda: reasons(repo).get("b") == ("READY", ""), "b served while a loads")
        assert reasons(repo)["a"] == ("LOADING", "warming up: gear 1, run 1 of 3")
    await events.wait("loaded", "a")
    assert reasons(repo) == {"a": ("READY", ""), "b": ("READY", "")}


@pytest.mark.asyncio
async def test_a_version_waiting_for_another_version_compiling_the_same_file_says_so(
        make_repo, models_dir, model_files, tmp_path, compile_holds):
    """Two versions of one model from the same .onnx bytes share one compile cache entry (and its
    lock): the one that waits names the other version compiling it, not another process."""
    repo, _ = await make_repo(model_control_mode="explicit", load_concurrency=2,
                              compile_cache_dir=str(tmp_path / "cache"))
    (models_dir / "m").mkdir()
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    for version in ("1", "2"):
        place(model_files[1]["onnx"], models_dir / "m" / version / "model.onnx")

    def versions() -> dict[str, tuple[str, str]]:
        return {row["version"]: (row["state"], row["reason"]) for row in repo.index() if row["name"] == "m"}
    load = asyncio.ensure_future(repo.load("m"))
    await until(lambda: any(compile_holds.iterdir()), "a compile held")  # one version compiles...
    await until(lambda: ("LOADING", WAITING_HERE) in versions().values(), "the other's wait said")  # ...one waits
    assert sorted(versions().values()) == [("LOADING", "compiling model.onnx for cpu"), ("LOADING", WAITING_HERE)]
    for mark in compile_holds.iterdir():
        mark.unlink()
    await load
    assert versions() == {"1": ("READY", ""), "2": ("READY", "")}


@pytest.mark.asyncio
async def test_a_load_waiting_for_another_repositorys_compile_in_this_process_does_not_name_a_version(
        make_repo, models_dir, model_files, tmp_path, compile_holds):
    """Two servers in one process (two repositories) sharing a compile cache folder, each loading
    the same .onnx as `m`: the one that waits was told it waited for another version of the model
    (the locks held were the process's, whoever held them); its own repository compiles nothing."""
    cache, other_models = tmp_path / "cache", tmp_path / "other-models"
    other_models.mkdir()
    first, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(cache))
    second, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(cache),
                                models_dir=str(other_models))
    place(model_files[1]["onnx"], models_dir / "m.onnx")
    place(model_files[1]["onnx"], other_models / "m.onnx")
    loads = [asyncio.ensure_future(first.load("m"))]
    await until(lambda: any(compile_holds.iterdir()), "the first one's compile held")
    assert reasons(first) == {"m": ("LOADING", "compiling m.onnx for cpu")}
    loads.append(asyncio.ensure_future(second.load("m")))
    await until(lambda: reasons(second).get("m", ("", ""))[1].startswith("waiting"), "the second one waits")
    assert reasons(second) == {"m": ("LOADING", WAITING_ELSEWHERE)}
    for mark in compile_holds.iterdir():
        mark.unlink()
    await asyncio.gather(*loads)
    assert reasons(first) == reasons(second) == {"m": ("READY", "")}


@pytest.mark.asyncio
async def test_a_long_step_says_how_long_so_far_and_the_next_step_counts_from_its_own_start(
        models_dir, model_files, compile_holds, clean_faults):
    """A 1.2 GB model's compile showed `compiling big.onnx for cpu` alone for 55-70 s, in the index
    and a request's 503: a slow load looked like a hung one. Its step made to look a minute old (the
    states' clock stopped a minute ahead, not a minute waited), both say how long so far; the
    warm-up after it counts from its own start."""
    runner, _, base, _, repo = await started_on_old_files(models_dir, "explicit")
    stopped_at: list[float] = []  # the states' clock, once stopped (the index and the request read one time)
    repo._lifecycle.states.clock = lambda: stopped_at[0] if stopped_at else time.monotonic()
    place(model_files[1]["onnx"], models_dir / "a.onnx")
    os.utime(models_dir / "a.onnx", (1, 1))  # (old: a load call takes it at once)
    try:
        async with aiohttp.ClientSession() as session:
            load = asyncio.ensure_future(session.post(f"{base}/v2/repository/models/a/load", json={}))
            await until(lambda: any(compile_holds.iterdir()), "the compile held")
            await until(lambda: reasons(repo).get("a") == ("LOADING", "compiling a.onnx for cpu"), "compiling")
            stopped_at.append(time.monotonic() + 60)
            state, reason = (await http_index(base))[("a", "1")]
            async with session.post(f"{base}/v2/models/a/infer", json={"inputs": []}) as resp:
                status, error = resp.status, (await resp.json())["error"]
            with held_run() as held:  # the warm-up's first run
                for mark in compile_holds.iterdir():
                    mark.unlink()
                await until(held.entered.is_set, "warming up")
                warming = (await http_index(base))[("a", "1")]
            async with await load as resp:
                assert resp.status == 200, await resp.text()
        so_far = re.fullmatch(r"compiling a\.onnx for cpu, (\d+) s so far", reason)
        assert state == "LOADING" and so_far and int(so_far[1]) >= 60, reason
        assert status == 503 and error == f"model a is not ready (LOADING: {reason})", error
        assert warming == ("LOADING", "warming up: gear 1, run 1 of 3")  # (its own start: not a minute ago)
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_log_says_a_quiet_compile_still_runs(make_repo, models_dir, model_files, compile_holds, monkeypatch,
                                                       caplog):
    """A CPU compile's log said nothing between `compiling ...` and `compiled in ...` (55-70 s for a 1.2 GB
    model): the compile's process says it still runs each STILL_COMPILING_EVERY_S it stays quiet (made
    short here; the compile is held until the line has come)."""
    monkeypatch.setattr(compile_process, "STILL_COMPILING_EVERY_S", 0.05)
    caplog.set_level(logging.INFO, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[1]["onnx"], models_dir / "a.onnx")
    load = asyncio.ensure_future(repo.load("a"))
    await until(lambda: any(compile_holds.iterdir()), "the compile held")
    await until(lambda: any("still compiling" in r.getMessage() for r in caplog.records), "the line said")
    for mark in compile_holds.iterdir():
        mark.unlink()
    await load
    said = [r for r in caplog.records if "still compiling" in r.getMessage()]
    assert re.fullmatch(r"a: still compiling a\.onnx: \d+ s", said[0].getMessage()), said[0].getMessage()
    assert said[0].levelno == logging.INFO and reasons(repo) == {"a": ("READY", "")}
