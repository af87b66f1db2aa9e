"""The compile cache heals (a corrupted or swapped entry is compiled again) and finds a writable
folder; the retry schedule backs off with jitter; auto queue limits come from the model."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from aclserve.acl.check import AclError
from aclserve.config import ModelConfig
from aclserve.errors import ExecutionFailed, ModelUnavailable
from aclserve.repository import ModelLoadFailed
from aclserve.repository import cache_dir, cache_entry, loader, overload
from aclserve.repository.retry import RetrySchedule, is_transient
from aclserve.runtime.device import LoadError
from aclserve.scheduling import QueuePolicy

from .repo_helpers import place, started_on_old_files, x_rows


def _entry(models_dir: Path) -> Path:
    (om,) = (models_dir / ".cache").glob("o-*.om")
    return om


def _empty_folder_for(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["truncate", "swap", "no manifest", "om is an empty folder",
                                    "manifest is an empty folder", "lock is an empty folder"])
async def test_a_bad_cache_entry_is_deleted_and_compiled_again(make_repo, models_dir, model_files, damage):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    om = _entry(models_dir)
    if damage == "truncate":
        om.write_bytes(om.read_bytes()[:100])
    elif damage == "swap":  # another model's OM under this entry's name: must not be served as "o"
        om.write_bytes(Path(model_files[3]["om"]).read_bytes())
    elif damage == "no manifest":
        cache_entry.manifest_path(om).unlink()
    elif damage == "om is an empty folder":  # the compile's rename cannot replace a folder
        _empty_folder_for(om)
    elif damage == "manifest is an empty folder":
        _empty_folder_for(cache_entry.manifest_path(om))
    else:  # a miss takes the entry's lock, whose file cannot be opened where a folder is
        om.unlink()
        (om.parent / f".{om.name}.lock").mkdir()
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    om = _entry(models_dir)
    assert cache_entry.problem(om, json.loads(cache_entry.manifest_path(om).read_text())["key"]) is None
    # readable by replicas running as other users, as the OM is (the manifest was 0600: such a
    # replica deleted the entry as unreadable and compiled it again)
    assert (om.stat().st_mode & 0o777, cache_entry.manifest_path(om).stat().st_mode & 0o777) == (0o644, 0o644)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["om", "manifest"])
async def test_a_folder_with_files_in_place_of_an_entry_is_left_alone_and_named(make_repo, models_dir, model_files,
                                                                               where):
    """Not made by aclserve, so maybe not its to delete: the model is not served, the index says
    why and what to do, and once the folder is gone a load compiles the entry again."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    om = _entry(models_dir)
    blocker = om if where == "om" else cache_entry.manifest_path(om)
    _empty_folder_for(blocker)
    (blocker / "keep.txt").write_text("not aclserve's")
    repo2, _ = await make_repo(model_control_mode="explicit")
    reason = repo2.load_failures()[("o", "1")]
    assert "is a folder with files in it" in reason and "remove it" in reason, reason
    assert (blocker / "keep.txt").read_text() == "not aclserve's"
    (blocker / "keep.txt").unlink()
    blocker.rmdir()
    await repo2.load("o")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_an_entry_removed_by_another_replica_during_the_load_is_compiled_again(make_repo, models_dir,
                                                                                      model_files, monkeypatch):
    """Replicas share the cache, and one retiring a replaced version removes its entry: another
    may have just found that entry for a file put back (a rollback). A load whose entry went
    between the hit and the open compiles it again instead of failing the file for good.
    The other replica's removal is made to land in that window (at the validation)."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    real_validate, removed = loader.validate_om, []

    def validate_while_another_replica_retires_the_entry(path, runtime_kind):
        if not removed:
            removed.append(path)
            cache_entry.remove(path)
        return real_validate(path, runtime_kind)

    monkeypatch.setattr(loader, "validate_om", validate_while_another_replica_retires_the_entry)
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    assert removed == [str(_entry(models_dir))]  # compiled again under the same name


def test_an_unwritable_models_folder_compiles_into_the_user_cache(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / ".cache").write_text("a file where the cache folder would be")  # cannot be written
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = cache_dir.resolve("", str(models), env)
    assert folder.parent == tmp_path / "xdg" / "aclserve" / "compile" and folder.name.startswith("models-")
    assert folder.is_dir()
    env = {"XDG_CACHE_HOME": str(models / ".cache" / "x")}  # not writable either
    with pytest.raises(cache_dir.CacheUnavailable, match="set compile_cache_dir to a writable folder"):
        cache_dir.resolve("", str(models), env)
    with pytest.raises(cache_dir.CacheUnavailable, match="compile_cache_dir"):
        cache_dir.resolve(str(models / ".cache" / "sub"), str(models), env)


def test_a_home_that_is_no_folder_is_not_made_for_the_user_cache(tmp_path):
    """The CPU image's user has /nonexistent for its home: a server run there as root with a
    read-only models folder made /nonexistent/.cache (a tester, t84). It is not made; why not is said."""
    models = tmp_path / "models"
    models.mkdir()
    (models / ".cache").write_text("a file where the cache folder would be")  # cannot be written
    home = tmp_path / "nonexistent"
    with pytest.raises(cache_dir.CacheUnavailable) as refused:
        cache_dir.resolve("", str(models), {"HOME": str(home)})
    assert not home.exists()
    assert str(refused.value) == (
        f"cannot compile .onnx models: {models / '.cache'} is not writable (File exists), and there is no user "
        f"cache folder to compile into instead: the home folder {home} (HOME) does not exist (it is not made); set "
        "compile_cache_dir to a writable folder, or XDG_CACHE_HOME")
    home.write_text("")
    with pytest.raises(cache_dir.CacheUnavailable, match=f"the home folder {home} \\(HOME\\) is not a folder"):
        cache_dir.resolve("", str(models), {"HOME": str(home)})
    # XDG_CACHE_HOME is the user's word for where: made if need be
    folder = cache_dir.resolve("", str(models), {"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert folder.is_dir() and folder.parent == tmp_path / "xdg" / "aclserve" / "compile"


@pytest.mark.asyncio
async def test_a_relative_models_folder_compiles_into_its_cache_named_as_its_sources_are(
        make_repo, models_dir, model_files, monkeypatch, caplog):
    """With a relative models folder (`aclserve serve`'s default, `models`) the compile's line mixed
    an absolute source with a relative entry, `o: compiling /.../models/o.onnx for cpu into
    models/.cache/o-<key>.om` (a tester's find); the README shows both absolute."""
    monkeypatch.chdir(models_dir.parent)
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    caplog.set_level(logging.INFO, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit", models_dir=models_dir.name)
    assert float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    compiling = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert compiling == [f"o: compiling {models_dir / 'o.onnx'} for cpu into {_entry(models_dir)}"]
    assert repo.get("o").om_path == str(_entry(models_dir))


@pytest.mark.asyncio
async def test_an_onnx_model_without_a_writable_cache_says_why(make_repo, models_dir, model_files):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / "blocker").write_text("")
    repo, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(models_dir / "blocker" / "c"))
    assert "cannot write the compile cache folder" in repo.load_failures()[("o", "1")]


@pytest.mark.asyncio
async def test_the_index_says_where_the_user_cache_fallback_was_tried(models_dir, model_files, tmp_path, monkeypatch):
    """The index's reason for an .onnx that no cache folder can take read "...neither is
    models-fdcdfbdd8767 (...)": paths are redacted from what clients read, and the fallback, a
    folder the redactor knows, was cut to its last name, saying not where it was (a review of
    the deploy files). It is named from the user cache folder on now, which is said in words."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / ".cache").write_text("a file where the cache folder would be")
    (tmp_path / "blocker").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocker" / "cache"))  # not writable either
    runner, _, base, _, _ = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                (row,) = [r for r in await resp.json() if r["name"] == "o"]
    finally:
        await runner.cleanup()
    folder = cache_dir.user_cache_folder(str(models_dir)).name
    assert row["state"] == "UNAVAILABLE" and str(tmp_path) not in row["reason"], row
    assert (f"neither is aclserve/compile/{folder} in the user cache folder cache ($XDG_CACHE_HOME, else ~/.cache: "
            f"Not a directory)") in row["reason"], row["reason"]


def test_backoff_doubles_up_to_the_ceiling_with_jitter_in_its_upper_half():
    schedule = RetrySchedule(1.0, 8.0, lambda *a: None, rng=random.Random(3))
    for attempt, ceiling in enumerate([1, 2, 4, 8, 8, 8]):
        delays = {schedule.delay(attempt) for _ in range(20)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays) and len(delays) > 1
    assert 4 <= schedule.delay(5000) <= 8  # a model that failed all week still retries at the ceiling


def test_only_device_and_resource_failures_are_transient():
    assert is_transient(ExecutionFailed("batch failed on device 0"))
    assert is_transient(AclError("rt.malloc", 207001)) and is_transient(AclError("mdl.execute", 507011))
    assert not is_transient(AclError("mdl.load_from_file", 145006))  # wrong kind of file
    assert not is_transient(ValueError("not an OM file"))
    # a warm-up batch: GE refusing the run for what it was given (145xxx) refuses it again; an unknown
    # model id (145003) is what a run meets when its model is unloaded under it
    for ret, transient in ((507011, True), (145000, False), (145013, False), (145003, True)):
        batch = ExecutionFailed("batch of 4 rows (gear 4) failed on device 0")
        batch.__cause__ = AclError("rt.synchronize_event_with_timeout", ret)
        assert is_transient(batch) is transient, ret
    # a load's own call (the model's memory, its load): the cause decides (om_model.py keeps it)
    for ret, transient in ((207001, True), (245000, True), (507899, True), (145000, False), (500002, False),
                           (207000, False), (200001, False)):
        try:
            try:
                raise AclError("mdl.load_from_file_with_mem", ret)
            except AclError as e:
                raise LoadError(f"model m: loading m.om failed ({e})") from e
        except LoadError as load_error:
            assert is_transient(load_error) is transient, ret
    assert not is_transient(LoadError("model m: 2,000,000 bytes would leave less than the reserve"))


def test_the_host_running_short_is_transient():
    """A full disk under the compile cache, no thread to be had, host memory: each failed the
    model for good, though nothing was wrong with its file (found by running the server short
    of each); freed, nothing loaded it until the file was touched."""
    import errno
    for error in (OSError(errno.ENOSPC, "No space left on device"), MemoryError(),
                  RuntimeError("can't start new thread"), OSError(errno.EMFILE, "Too many open files")):
        try:
            try:
                raise error
            except BaseException as e:
                raise LoadError("model m: loading failed") from e
        except LoadError as wrapped:
            assert is_transient(error) and is_transient(wrapped), error
    assert not is_transient(OSError(errno.EACCES, "Permission denied"))
    try:  # the file checks hide the OSError they turn into "cannot read the file" (`from None`)
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError:
            raise ValueError("cannot read the file: Too many open files") from None
    except ValueError as hidden:
        assert is_transient(hidden)
    assert not is_transient(RuntimeError("instances of one pool loaded different models"))


@pytest.mark.asyncio
async def test_a_compile_that_runs_out_of_disk_is_retried(make_repo, models_dir, model_files, monkeypatch):
    """The compile cache's disk full, then room again: the model loads with no one touching it."""
    import errno
    from aclserve.repository import compiler
    real, calls = compiler.compiled_om, []

    def full_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compiled_om", full_once)  # (the disk, not the compile: as a full one fails)
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, events = await make_repo(start=False, load_retry_initial_s=0.2, load_retry_max_s=0.4)
    await repo.start()
    await events.wait("load_failed", "o")
    (failed,) = [e for e in events.seen if e[0] == "load_failed"]  # names the folder that is full
    assert f"No space left on device: {models_dir / '.cache'}, the compile cache" in failed[3]["reason"], failed
    await events.wait("loaded", "o", limit_s=30)  # (a hang guard: it waited for good)
    assert len(calls) == 2 and float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_a_device_error_of_the_model_load_itself_is_retried(make_repo, models_dir, model_files, clean_faults):
    """Out of device memory where the model's load runs (GE allocates more than query_size
    counts): retried as a device error is one step later (a slot's buffer), not refused for
    good as a bad file (OmModel wrapped the code away)."""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("load", nth=1, code=207001)
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=0.2,
                                   load_retry_max_s=0.4)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and "transient device error: retry 1 in" in row["reason"], row
    assert "207001" in row["reason"]
    await events.wait("loaded", "m")
    result = await repo.get("m").infer(x_rows(), 1)
    assert float(result.outputs["y"][0, 0]) == 1.0  # model_files[1]: y = x * 1


@pytest.mark.asyncio
async def test_a_model_whose_description_cannot_be_read_is_refused_not_retried(make_repo, models_dir, model_files,
                                                                              clean_faults):
    """GE failing to read a loaded model's description (500002) fails the same way on every
    attempt: refused for good, naming the step, and not retried for ever as a bare device
    error was; a device short of memory there (207001) is retried."""
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("describe", count=1, code=500002)
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.2,
                                   load_retry_max_s=0.4)
    await repo.start()
    await events.wait("load_failed", "m")
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and "reading the description of" in row["reason"], row
    assert "500002" in row["reason"] and "retry" not in row["reason"] and repo.load_retries.get("m", 0) == 0
    faults.inject("describe", count=1, code=207001)
    place(model_files[2]["om"], models_dir / "m.om")  # a new file: tried again
    await events.wait("load_failed", "m", count=2)
    (row,) = repo.index()
    assert "207001" in row["reason"] and "transient device error: retry 1 in" in row["reason"], row
    await events.wait("loaded", "m")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_the_load_api_answers_a_failure_that_is_retried_as_unavailable(make_repo, models_dir, model_files,
                                                                            clean_faults):
    """A load the device refused for want of memory is retried by the repository: the load API
    says so as 503 (try again later), not as the 400 of a file that cannot be served, and the
    model serves once the retry loads it."""
    from aclserve.acl.cpu import faults
    repo, events = await make_repo(model_control_mode="explicit", load_retry_initial_s=0.2, load_retry_max_s=0.4)
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("load", nth=1, code=207001)
    with pytest.raises(ModelUnavailable, match=r"failed to load m: version 1: .*207001.*retry 1 in"):
        await repo.load("m")
    await events.wait("loaded", "m")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0


@pytest.mark.asyncio
async def test_a_failure_retried_keeps_one_reason_and_the_index_says_when(make_repo, models_dir, model_files,
                                                                         clean_faults):
    """aclserve_model_load_failure took the reason as a label, retry plan and all: every retry
    made a new series, so an alert on one never held."""
    from aclserve.acl.cpu import faults
    repo, events = await make_repo(model_control_mode="explicit", load_retry_initial_s=0.2, load_retry_max_s=0.4)
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("load", count=2, code=207001)  # the first load and its first retry
    with pytest.raises(ModelUnavailable, match=r"207001.*\(transient device error: retry 1 in"):
        await repo.load("m")
    reason = repo.load_failures()[("m", "1")]
    assert reason.endswith("(transient device error)") and "retry" not in reason, reason
    (row,) = repo.index()
    assert "(transient device error: retry 1 in" in row["reason"], row

    async def second_failure():
        while "retry 2 in" not in repo.index()[0]["reason"]:
            await asyncio.sleep(0.005)
    await asyncio.wait_for(second_failure(), 60)  # a hang guard: the retry is due within 0.2 s
    assert repo.load_failures()[("m", "1")] == reason
    await events.wait("loaded", "m")
    assert repo.load_failures() == {}


@pytest.mark.asyncio
async def test_none_mode_does_not_load_a_version_added_while_a_failing_load_ran(make_repo, models_dir, model_files,
                                                                               clean_faults):
    """A load task with a failure (version 2 is not a model) left its model marked for another
    look; answering that look in none mode (to keep a retry that came due meanwhile) loaded
    what had changed on disk: version 3, added while version 1 warmed up."""
    import threading
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    (models_dir / "vm" / "2").mkdir(parents=True)
    (models_dir / "vm" / "2" / "model.om").write_bytes(b"garbage" * 100)
    (models_dir / "vm" / "config.yaml").write_text("version_policy: all\n")
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)  # version 1's warm-up waits for the test
    repo, events = await make_repo(start=False, model_control_mode="none")
    starting = asyncio.ensure_future(repo.start())
    while not held.entered.is_set():  # a hang guard follows: the start's own
        await asyncio.sleep(0.01)
    place(model_files[3]["om"], models_dir / "vm" / "3" / "model.om")
    gate.set()
    await asyncio.wait_for(starting, 120)
    await repo._lifecycle.tasks.wait_idle()
    await asyncio.gather(*repo._retry_tasks)  # what a task's end started, if anything
    await repo._lifecycle.tasks.wait_idle()
    assert sorted(r["version"] for r in repo.index(ready_only=True)) == ["1"]


@pytest.mark.asyncio
async def test_a_model_that_fails_on_the_warm_ups_zeros_says_so(make_repo, models_dir):
    """An integer division by its input: the warm-up's zeros fail it. The reason named neither the
    warm-up nor the model's own message, and the CPU runtime logged a traceback of its own code."""
    import onnx
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["x", "x"], ["y"])], "idiv",
                              [vi("x", TensorProto.INT32, ["n", 2])], [vi("y", TensorProto.INT32, ["n", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / "idiv.onnx")
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=60.0,
                                   load_retry_max_s=60.0)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and "the warm-up run on zeros failed" in row["reason"], row
    assert "if the model cannot run on zeros, warmup_data: ones in its config" in row["reason"], row
    # ONNX Runtime's reason, which the device's message carries (acl.get_recent_err_msg); retried, as
    # on a device, whose fault on its data says no more
    assert ("failed with 507011: model execution failed on the device; the device says: the model failed in ONNX "
            "Runtime: ") in row["reason"] and "Integer division by zero" in row["reason"], row
    assert "(transient device error" in row["reason"], row


@pytest.mark.asyncio
async def test_a_model_whose_om_declares_a_gear_its_graph_does_not_serve_says_so_and_is_not_retried(
        make_repo, models_dir, tmp_path):
    """y = x[:2] in an OM of gears 1,2,4 (what the compile wrote when its test runs took 1 and 2
    only): its warm-up at gear 4 failed with 507011, said "the warm-up run on zeros failed ... (if
    the model cannot run on zeros, warmup_data: ones ...) (transient device error: retry N ...)",
    retried for good (found by a tester). The CPU runtime refuses the run as GE refuses a run's
    parameters, saying the model's own reason, and the load is not retried."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from aclserve.om import container
    from aclserve.om.compile import compile_model
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], "capped",
                              [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "capped.onnx")
    om = container.read(compile_model(tmp_path / "capped.onnx", tmp_path / "capped.om", batch=[1, 2], target="cpu",
                                      log=lambda line: None).path)
    header = {key: value for key, value in om.header.items() if key != "payload_sha256"}
    container.write(models_dir / "capped.om", dict(header, gears=[1, 2, 4]), om.payload)
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=0.2,
                                   load_retry_max_s=0.4)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and row["reason"] == (
        "the warm-up run failed: batch of 4 rows (gear 4) failed on device 0, instance capped:1#0: "
        "acl.rt.synchronize_event_with_timeout failed with 145000: model parameter invalid (e.g. a buffer smaller "
        "than the tensor); the device says: the model's graph computes output 'y' as [2, 3] at batch 4, where its "
        "OM declares [4, 3]: the OM's header and its graph disagree (compiled for a batch size it does not serve)")
    # (no "(transient device error: retry 1 in ...)": no retry armed, refused until its file changes)
    assert repo._failures.refused_for_good("capped")


@pytest.mark.asyncio
async def test_a_model_that_cannot_run_on_zeros_warms_up_on_ones(make_repo, models_dir):
    """Such a model could never load (retried for good as a device fault, every request 503):
    with `warmup_data: ones` it serves (found by an independent check)."""
    import onnx
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "idiv",
                              [vi("a", TensorProto.INT64, ["n", 2]), vi("b", TensorProto.INT64, ["n", 2])],
                              [vi("y", TensorProto.INT64, ["n", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / "idiv.onnx")
    (models_dir / "idiv.yaml").write_text("warmup_data: ones\n")
    repo, _ = await make_repo(model_control_mode="none")
    result = await repo.get("idiv").infer({"a": np.array([[7, 9]]), "b": np.array([[2, 3]])}, 1)
    assert result.outputs["y"].tolist() == [[3, 3]]
    # 3 rows run in gear 4: its padding row was zeros, and every padded batch failed (found by a review)
    result = await repo.get("idiv").infer({"a": np.array([[7, 9]] * 3), "b": np.array([[2, 3]] * 3)}, 3)
    assert result.outputs["y"].tolist() == [[3, 3]] * 3


@pytest.mark.asyncio
async def test_a_dropped_onnx_that_needs_a_shape_is_told_the_yaml_key(make_repo, models_dir):
    """A sequence dimension the compile cannot fix alone: the reason said "fix it with
    --input-shape", a flag of `aclserve compile`, where a dropped model's YAML takes
    compile.input_shape."""
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "seq",
                              [vi("x", TensorProto.FLOAT, ["n", "s"])], [vi("y", TensorProto.FLOAT, ["n", "s"])])
    reason = await _refused_then_served(make_repo, models_dir, "seq", graph, "compile:\n  input_shape: 'x:-1,5'\n")
    assert "fix it with compile.input_shape" in reason and "--input-shape" not in reason, reason


@pytest.mark.asyncio
async def test_a_dropped_onnx_told_to_compile_for_one_batch_size_is_given_valid_yaml(make_repo, models_dir):
    """An output that is not batch-major: the reason said "compile.batch 1", and `batch: 1` is
    refused (a list of integers): it says `compile.batch: [1]`, which serves (found by a helper)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    shape = numpy_helper.from_array(np.array([-1, 6], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "flat",
                              [vi("x", TensorProto.FLOAT, ["n", 10, 6])], [vi("y", TensorProto.FLOAT, ["m", 6])],
                              [shape])
    reason = await _refused_then_served(make_repo, models_dir, "flat", graph, "compile:\n  batch: [1]\n")
    assert "(or compile it for one batch size: compile.batch: [1])" in reason, reason


@pytest.mark.asyncio
async def test_a_dropped_onnx_that_serves_some_batch_sizes_is_told_them_in_yaml(make_repo, models_dir):
    """A Slice capping the batch at 2 rows: the compile test-runs every default size up to 32 and
    names the sizes it serves, `compile.batch: [1,2]` (a `--batch 1,2` read as `[1],2` was no YAML)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], "first2",
                              [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, None)], inits)
    reason = await _refused_then_served(make_repo, models_dir, "first2", graph, "compile:\n  batch: [1,2]\n")
    assert reason.endswith("follows the batch at batch sizes 1, 2 only; compile it for those (compile.batch: [1,2])")


@pytest.mark.asyncio
async def test_a_dropped_onnx_whose_only_open_dimension_is_a_sequence_is_told_to_fix_it(make_repo, models_dir):
    """ids ["S"] pooled to [8]: the reason said only `compile.batch: [1]`, which serves a model
    taking one token; dimension 0 only assumed to be the batch, it names compile.input_shape too,
    which serves it (found by an independent tester)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    emb = numpy_helper.from_array(np.arange(80, dtype=np.float32).reshape(10, 8), "emb")
    graph = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["g"]),
                               helper.make_node("ReduceMean", ["g"], ["pooled"], axes=[0], keepdims=0)], "pool",
                              [vi("ids", TensorProto.INT64, ["S"])], [vi("pooled", TensorProto.FLOAT, [8])], [emb])
    reason = await _refused_then_served(make_repo, models_dir, "pool", graph, "compile:\n  input_shape: 'ids:16'\n")
    assert "not batch-major" in reason and reason.endswith('give its size instead, e.g. compile.input_shape "ids:16"')


@pytest.mark.asyncio
async def test_a_dropped_onnx_whose_rows_depend_on_each_other_is_not_served_as_a_batch_model(make_repo, models_dir):
    """A Softmax over dim 0 was compiled with gears and served: two one-row requests batched
    together were answered 0.835 and 0.165, 1.0 each alone (found by an independent tester)."""
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=0)], "mix",
                              [vi("x", TensorProto.FLOAT, ["b", 4])], [vi("y", TensorProto.FLOAT, ["b", 4])])
    reason = await _refused_then_served(make_repo, models_dir, "mix", graph, "compile:\n  batch: [1]\n")
    assert "rows of input 'x' along the dynamic dimension 0 are not independent" in reason, reason
    assert ("compile it for a static batch (compile.batch: [1]) or fix that dimension with compile.input_shape "
            '"x:SIZE,4"') in reason, reason


async def _refused_then_served(make_repo, models_dir, name: str, graph, remedy: str) -> str:
    """Drop `graph` as NAME.onnx, see its load refused, write the `remedy` YAML the reason names,
    see it serve. Returns the reason."""
    import onnx
    from onnx import helper
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / f"{name}.onnx")
    repo, events = await make_repo(start=False, model_control_mode="explicit")
    await repo.start()
    with pytest.raises(ModelLoadFailed):
        await repo.load(name)
    (row,) = repo.index()
    (models_dir / f"{name}.yaml").write_text(remedy)
    await repo.load(name)
    assert [r["state"] for r in repo.index()] == ["READY"]
    return row["reason"]


@pytest.mark.asyncio
async def test_a_dropped_sequence_first_onnx_is_told_its_batch_must_come_first(make_repo, models_dir):
    """An LSTM's x [T, N, 4]: its load failed as "input 'x' dim 1 is dynamic (batch)" (a tester, t85)."""
    from onnx import TensorProto, helper, numpy_helper
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 32, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 32, 8)).astype(np.float32), "R")]
    graph = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=8)], "rnn",
                              [vi("x", TensorProto.FLOAT, ["T", "batch", 4])],
                              [vi("y", TensorProto.FLOAT, ["T", 1, "batch", 8])], inits)
    reason = await _refused_then_served(make_repo, models_dir, "rnn", graph, "compile:\n  input_shape: 'x:16,1,4'\n")
    assert "input 'x' has its batch at dimension 1 (batch; shape [?,?,4]), as a sequence-first model" in reason
    assert reason.endswith('every dimension fixed: compile.input_shape "x:16,1,4" (a request then gives that shape)')


@pytest.mark.asyncio
async def test_a_load_failing_again_for_want_of_memory_is_a_400(make_repo, models_dir, model_files, clean_faults):
    """A device too small for the model fails with an out-of-memory code every time: after its
    first failure the load API no longer says "try later" (each call loaded it at once, past the
    backoff, and a client honouring Retry-After did so every second for ever)."""
    from aclserve.acl.cpu import faults
    repo, _ = await make_repo(model_control_mode="explicit", load_retry_initial_s=60.0, load_retry_max_s=60.0)
    place(model_files[1]["om"], models_dir / "big.om")
    faults.inject("load", code=207001)  # every load
    with pytest.raises(ModelUnavailable, match="retry 1 in") as refused:
        await repo.load("big")
    assert 29.0 < refused.value.retry_after_s <= 60.0  # when that retry is due (a draw in 30-60 s), not 1 s
    with pytest.raises(ModelLoadFailed, match="retry 2 in"):
        await repo.load("big")


@pytest.mark.asyncio
async def test_a_retry_due_while_another_version_loads_is_not_lost(make_repo, models_dir, model_files, clean_faults):
    """Explicit mode: version 1 fails for want of device memory, and its retry comes due while
    version 2 still loads; the model's task was busy, so the retry planned nothing, and nothing
    asked again once the task ended (poll mode rescans then): version 1 was never loaded."""
    from aclserve.acl.cpu import faults
    repo, events = await make_repo(model_control_mode="explicit", load_retry_initial_s=0.1, load_retry_max_s=0.2)
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "vm" / "2" / "model.om")
    (models_dir / "vm" / "config.yaml").write_text("version_policy: all\n")
    faults.inject("load", nth=1, code=207001)  # the first version's load
    faults.inject("load", nth=2, delay_ms=1000)  # the second's: far longer than the first's retry delay
    with pytest.raises(ModelUnavailable, match="version 1: .*retry 1 in"):
        await repo.load("vm")
    await events.wait("loaded", "vm", "1")  # a hang guard, not a timing check
    assert sorted(r["version"] for r in repo.index(ready_only=True)) == ["1", "2"]


def test_auto_queue_limits_follow_gears_instances_and_speed():
    config = overload.resolve(ModelConfig(), (1, 2, 4, 8), {8: 0.5}, instances=2)
    policy = config.batching.default_queue_policy
    assert policy.max_queue_size == 8 * 8 * 2 and policy.counts_rows  # rows: 8 full batches per instance
    assert policy.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)  # twice (window + 8 runs of a full queue)
    # a size configured counts requests, as in Triton; an auto deadline beside it is still derived
    configured = dataclasses.replace(ModelConfig().batching, default_queue_policy=QueuePolicy(
        max_queue_size=100, default_timeout_ms=None))
    given = overload.resolve(dataclasses.replace(ModelConfig(), batching=configured), (1, 2, 4, 8), {8: 0.5},
                             instances=2).batching.default_queue_policy
    assert (given.max_queue_size, given.counts_rows) == (100, False)
    assert given.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 50)  # each request a full batch: 100 runs on 2
    fast = overload.resolve(ModelConfig(), (1,), {1: 0.001}, instances=1).batching.default_queue_policy
    assert fast.max_queue_size == overload.MIN_QUEUE and fast.default_timeout_ms == overload.MIN_DEADLINE_MS


def test_an_auto_deadline_beside_a_size_in_requests_allows_for_a_full_batch_each(caplog):
    """A size configured counts requests, which may bring one row each or the batch limit's: the auto
    deadline was derived as if the size were rows (100 requests: 7 runs of 8 rows on 2 instances), so
    a level full of full batches, 50 runs, waited out a deadline made for 7 (on the heavy CNN, 48 of 64
    requests of 32 rows got 503 "timed out" after 2 s in the queue). Now it allows for a run a request,
    on the gear of the batch limit: with batching off too, where a request runs alone on the gear that
    holds it (not the smallest one's cost); and the INFO line says how to have a shorter one, a WARNING
    when it is over 60 s (max_queue_size 1000 at 150 ms a run: 300 s)."""
    def sized(size, **batching):
        return dataclasses.replace(ModelConfig(), batching=dataclasses.replace(
            ModelConfig().batching, default_queue_policy=QueuePolicy(max_queue_size=size, default_timeout_ms=None),
            **batching))

    gears = (1, 2, 4, 8, 16, 32)
    costs = {1: 0.05, 16: 0.3, 32: 0.5}
    on = overload.resolve(sized(64), gears, costs, instances=1).batching.default_queue_policy
    assert on.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 64)  # 64 runs of 32 rows, not 64 rows in 2 runs
    caplog.clear()  # the call above said its 64 s as a WARNING
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        overload.resolve(sized(64), gears, {1: 0.05, 16: 0.3, 32: 0.4}, instances=1, name="m:1")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", (
        "m:1: max_queue_size 64 counts requests, each of up to 32 rows: its auto default_timeout_ms, 51202, "
        "allows for 64 requests of 32 rows queued; set default_timeout_ms for a shorter deadline, or "
        "max_queue_size: auto to bound the rows"))]  # (it wrote "max_queue_size auto", the WARNINGs the YAML's words)
    caplog.clear()
    # the deadline grows with the size and the run cost (up to MAX_DEADLINE_MS): over 60 s it is a WARNING naming it
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        overload.resolve(sized(1000), gears, {32: 0.15}, instances=1, name="m:1")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", (
        "m:1: max_queue_size 1000 counts requests, each of up to 32 rows: its auto default_timeout_ms is 300002 "
        "(300 s, over 60 s), allowing for 1000 requests of 32 rows queued, so a stalled device is found only "
        "that late; set default_timeout_ms for a shorter deadline, or max_queue_size: auto to bound the rows"))]
    capped = overload.resolve(sized(64, batch_cap=16), gears, costs, instances=2).batching.default_queue_policy
    assert capped.default_timeout_ms == 2 * (1.0 + 1000 * 0.3 * 32)  # 16 rows each, on gear 16, 2 instances
    off = overload.resolve(sized(64, enabled=False), gears, costs, instances=1).batching.default_queue_policy
    assert off.default_timeout_ms == 2 * 1000 * 0.5 * 64  # alone on gear 32 each, no window (was gear 1's cost)
    static = overload.resolve(sized(64), (), {1: 0.05}, instances=1).batching.default_queue_policy
    assert static.default_timeout_ms == 2 * 1000 * 0.05 * 64  # its one run each, as before
    # the auto size counts rows: its deadline is the rows' (8 runs of 32), and an unbounded level's too
    auto = overload.resolve(ModelConfig(), gears, costs, instances=1).batching.default_queue_policy
    assert auto.counts_rows and auto.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)
    assert overload.resolve(sized(0), gears, costs, instances=1).batching.default_queue_policy.default_timeout_ms \
        == auto.default_timeout_ms


def test_an_auto_deadline_is_at_most_what_a_written_one_may_be(caplog):
    """Beside a size of 10**17 requests the deadline was 3.3e16 ms, whose microseconds /config could not
    show (500: tests/server/test_queue_rows.py); it is capped at the longest a written default_timeout_ms
    may be (24.8 days), and the WARNING says so. A window that long capped the rows' deadline too."""
    from aclserve.config.checks import MAX_MS
    size = 10**17
    huge = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(
        ModelConfig().batching, default_queue_policy=QueuePolicy(max_queue_size=size, default_timeout_ms=None)))
    with caplog.at_level("INFO", logger="aclserve.repository.overload"):
        policy = overload.resolve(huge, (1, 32), {32: 0.15}, instances=1, name="m:1").batching.default_queue_policy
    assert policy.default_timeout_ms == overload.MAX_DEADLINE_MS == MAX_MS
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", (
        f"m:1: max_queue_size {size} counts requests, each of up to 32 rows: its auto default_timeout_ms is "
        "2147483647 (2147484 s), the longest a deadline may be, though 100000000000000000 requests of 32 rows "
        "queued take longer to run: a stalled device is found only that late, and a full queue's last requests may "
        "time out; set default_timeout_ms for a shorter deadline, or max_queue_size: auto to bound the rows"))]
    window = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching,
                                                                            max_queue_delay_ms=MAX_MS))
    assert overload.resolve(window, (1, 32), {32: 0.15}, instances=1).batching.default_queue_policy \
        .default_timeout_ms == MAX_MS


def test_auto_queue_limits_count_a_full_batch_of_a_lower_max_batch_size():
    def capped(rows):
        return dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching, batch_cap=rows))

    gears = (1, 2, 4, 8, 16, 32)
    policy = overload.resolve(capped(16), gears, {16: 0.5, 32: 1.0}, instances=1).batching.default_queue_policy
    assert policy.max_queue_size == 8 * 16  # not 8 x the largest gear, 32
    assert policy.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)  # 8 runs of gear 16's cost
    # a cap between gears runs on the next gear up, and costs that gear's run
    between = overload.resolve(capped(12), gears, {16: 0.5, 32: 1.0},
                               instances=1).batching.default_queue_policy
    assert between.max_queue_size == 8 * 12 and between.default_timeout_ms == 2 * (1.0 + 1000 * 0.5 * 8)


def test_auto_queue_limits_count_one_request_a_full_batch_where_each_run_holds_one():
    """Batching off, a full batch is one request, not the largest gear (8 x 32 = 256 lone runs a
    level, an independent check saw); costed on the smallest gear, with no batching window. A
    static model's run is costed as its own (STATIC_RUN), as before, with no window either."""
    off = dataclasses.replace(ModelConfig(), batching=dataclasses.replace(ModelConfig().batching, enabled=False))
    gears, costs = (1, 2, 4, 8, 16, 32), {1: 0.05, 32: 0.5}
    policy = overload.resolve(off, gears, costs, instances=1).batching.default_queue_policy
    assert policy.max_queue_size == overload.MIN_QUEUE  # 8 x 1 x 1, raised to the floor for closed-loop clients
    assert policy.default_timeout_ms == 2 * 1000 * 0.05 * overload.MIN_QUEUE  # twice 64 runs of gear 1
    assert overload.resolve(off, gears, costs, instances=16).batching.default_queue_policy.max_queue_size == 8 * 16
    static = overload.resolve(ModelConfig(), (), {1: 0.05}, instances=1).batching.default_queue_policy
    assert (static.max_queue_size, static.default_timeout_ms) == (policy.max_queue_size, policy.default_timeout_ms)
    # batching on, the same gears still count the largest one
    on = overload.resolve(ModelConfig(), gears, costs, instances=1).batching.default_queue_policy
    assert on.max_queue_size == 8 * 32


def test_sweep_removes_what_interrupted_compiles_left_unless_a_compile_holds_it(tmp_path):
    """A process gone between an entry's rename and its manifest leaves a full-size .om nobody
    will use (its .onnx may be gone too), and a killed one its lock file: removed at start.
    An entry whose lock is held (a replica compiling it) stays."""
    import fcntl

    from aclserve.repository import entry_locks
    from aclserve.repository.entry_locks import sweep
    a, b, c, d = (f"{m}-{k * 32}.om" for m, k in (("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")))
    (tmp_path / a).write_bytes(b"om")
    (tmp_path / f"{a}.json").write_text("{}")
    (tmp_path / b).write_bytes(b"om" * 1000)  # no manifest: interrupted
    (tmp_path / f".{b}.lock").write_bytes(b"")  # its writer killed holding it
    (tmp_path / c).write_bytes(b"om")  # no manifest yet: a replica is writing it
    (tmp_path / f".{d}.lock").write_bytes(b"")
    (tmp_path / "resnet50.om").write_bytes(b"om")  # the user's own, in a configured cache folder
    held = os.open(tmp_path / f".{c}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweep(tmp_path) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".{c}.lock", a, f"{a}.json", c, "resnet50.om"]
        # the replica finishes it (its manifest) and lets go: what the listing saw is not taken on
        (tmp_path / f"{c}.json").write_text("{}")
        assert entry_locks._remove_if_unfinished(tmp_path / c) is False and (tmp_path / c).exists()
    finally:
        os.close(held)
    (tmp_path / f"{c}.json").unlink()
    assert sweep(tmp_path) == 1  # its holder gone without a manifest: interrupted too
    assert sorted(p.name for p in tmp_path.iterdir()) == [a, f"{a}.json", "resnet50.om"]
    assert sweep(tmp_path / "nope") == 0


LOAD_UNDER_A_MEMORY_LIMIT = """
import resource, sys
from aclserve.repository.retry import is_transient
from aclserve.runtime import AclRuntime, open_pool
rt = AclRuntime(device="cpu").start()
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[2]) * (1 << 20), resource.RLIM_INFINITY))
try:
    open_pool(rt, sys.argv[1], "big", instances=1).close()
    print("loaded")
except Exception as e:
    print("transient" if is_transient(e) else f"refused for good: {e}")
"""


def test_a_load_short_of_host_memory_is_transient_however_it_fails(tmp_path):
    """Under a memory limit a valid model's load fails in Python (MemoryError), in a thread's
    start, or inside ONNX Runtime (std::bad_alloc), which the CPU runtime answered 145006, "not a
    loadable OM file": refused for good (found by a review, under `ulimit -v`). Whichever way it
    fails here, it must be retried; with room enough it loads."""
    import subprocess
    import sys

    from onnx import TensorProto, helper, numpy_helper

    from tests.tiny_models import compile_cpu_om, save_graph
    n = 3000  # 36 MB of weights
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [numpy_helper.from_array(np.zeros((n, n), np.float32), "w")])
    om = compile_cpu_om(save_graph(graph, tmp_path / "big.onnx"), tmp_path / "big.om", batch="1")
    said = []
    for extra_mb in (60, 120, 180, 240, 300, 400, 600, 4000):
        proc = subprocess.run([sys.executable, "-c", LOAD_UNDER_A_MEMORY_LIMIT, om, str(extra_mb)],
                              capture_output=True, text=True, timeout=120)
        said.append(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:])
    assert all(s in ("transient", "loaded") for s in said), said
    assert said[-1] == "loaded", said
