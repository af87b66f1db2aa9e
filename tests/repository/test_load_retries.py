"""Loads retried after a transient failure: a compile out of disk, a device error of the load itself
(a description GE cannot read is refused, not retried); what the index and the load API say meanwhile
(503, then 400 once it fails again for the same want); a retry due while another version loads is not
lost, and none mode loads no version added meanwhile."""
from __future__ import annotations

import asyncio

import pytest

from aclserve.errors import ModelUnavailable
from aclserve.repository import ModelLoadFailed

from .repo_helpers import place, x_rows


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
