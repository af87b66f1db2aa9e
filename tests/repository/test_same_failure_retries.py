"""Which repeated warm-up failures stop the automatic retries (repository/retry.py warm_up_failure):
the same run failing with the same code and the device's same words at three attempts in a row or
more, the first of them at least `load_retry_max_s` before the last, is the model's failure; an
injected device fault is retried as before, unless it repeats identically that long (its count
says so), and so is one that fails the same way three times within `load_retry_max_s` (a device
fault lasting a few seconds)."""
from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from aclserve.acl.check import AclError
from aclserve.acl.cpu import faults
from aclserve.errors import ExecutionFailed
from aclserve.repository.failures import LoadFailures
from aclserve.repository.layout import VersionFile
from aclserve.runtime.left_on_device import LeftOnDevice, note_left

from tests.tiny_models import compile_cpu_om, scale_onnx

from .repo_helpers import serving

# the stopped reason's end: the attempts in a row (three at least) and the seconds they spanned
STOPPED = re.compile(r"\(failed the same way ([3-9]|\d\d+) times in a row over \d+\.\d s: the model's failure")

pytestmark = pytest.mark.asyncio


def _reason(repo, name: str) -> str:
    return next((r["reason"] for r in repo.index() if r["name"] == name), "")


async def test_only_the_same_failure_of_the_same_run_for_max_s_stops_the_retries(make_repo, models_dir,
                                                                                  tmp_path, clean_faults):
    """`same` fails its first warm-up run 507011 at every attempt; `moving` fails three times,
    at another run each time (runs 1, 2 and 3 of gear 1), as a device fault striking anywhere does."""
    src = scale_onnx(tmp_path / "scale.onnx", 2.0)
    for name in ("same", "moving"):
        compile_cpu_om(src, models_dir / f"{name}.om", batch="1,2")
    faults.inject("execute", model="same")  # (no count: every execute of the model, each attempt's first run)
    for nth in (1, 3, 6):  # (each fault counts the model's runs since it was injected)
        faults.inject("execute", model="moving", nth=nth, count=1)
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=0.1)
    await repo.start()
    await events.wait("loaded", "moving", limit_s=60)  # (a hang guard)
    await events.until(lambda: "not retried" in _reason(repo, "same"), limit_s=60)  # (a hang guard)
    reason = _reason(repo, "same")
    stopped = STOPPED.search(reason)
    assert "failed with 507011" in reason and stopped, reason
    assert repo.load_retries["moving"] == 3 and repo.load_retries["same"] == int(stopped[1]) - 1
    assert serving(repo) == ["moving"]


async def test_the_same_failure_three_times_within_max_s_is_retried_still(make_repo, models_dir, tmp_path,
                                                                          clean_faults):
    """A device fault that fails the same run alike three times in a row, all within `load_retry_max_s`
    (here its first three attempts, well under 30 s), is retried still: the 4th attempt loads. They were
    taken as the model's failure, and a fault of a few seconds on a device stopped its retries for good."""
    compile_cpu_om(scale_onnx(tmp_path / "scale.onnx", 2.0), models_dir / "brief.om", batch="1,2")
    faults.inject("execute", model="brief", count=3)  # each of the first three attempts' first run
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=30)
    await repo.start()
    await events.until(lambda: serving(repo) == ["brief"] or "not retried" in _reason(repo, "brief"),
                       limit_s=60)  # (a hang guard)
    assert serving(repo) == ["brief"], _reason(repo, "brief")
    assert repo.load_retries["brief"] == 3


class _Abandoned:
    """What LeftOnDevice tracks of an instance: its device, and a word once the device let go of it
    (a real one is abandoned only when the device hangs on its work: test_warmup_timeout.py)."""

    def __init__(self):
        self.device, self._freed = SimpleNamespace(id=0), []

    def when_freed(self, callback) -> None:
        self._freed.append(callback)

    def let_go(self) -> None:
        for callback in self._freed:
            callback()


def _warm_up_failed(left: LeftOnDevice) -> ExecutionFailed:
    """The first warm-up run failed 507011 with the device's words, its closed pool having left `left`."""
    error = ExecutionFailed("batch of 1 row (gear 1) failed on device 0")
    error.__cause__ = AclError("rt.synchronize_event_with_timeout", 507011, said="Integer division by zero")
    error.warm_up_run = (1, 0)
    note_left(error, left)
    return error


async def test_a_stopped_failure_still_holds_a_load_call_back_while_its_load_left_instances():
    """The third identical failure's closed pool left an instance abandoned: its retries stop, and
    the model is counted as holding it (a load call is refused: repository.py _refuse_while_held)
    until the device lets go, when no retry is armed. The stopped path skipped that bookkeeping."""
    now = [0.0]
    failures = LoadFailures(0.05, 1.0, lambda name, version: None, clock=lambda: now[0])
    file = VersionFile("/models/m.om", "om", 1, 1)
    abandoned, left = _Abandoned(), LeftOnDevice()
    left.track(abandoned)
    try:
        for attempt, on_device in enumerate((LeftOnDevice(), LeftOnDevice(), left)):
            now[0] = attempt * 0.6  # (the third 1.2 s after the first: past max_s)
            reason = failures.record("m", "1", file, _warm_up_failed(on_device))
        assert STOPPED.search(reason) and failures.refused_for_good("m"), reason
        assert failures.held_by("m", {"1": file.identity}) == 1
        abandoned.let_go()
        await asyncio.sleep(0)  # (the word reaches the loop)
        assert failures.held_by("m", {"1": file.identity}) == 0
        assert failures.refused_for_good("m") and failures.retry_due_in("m", ["1"]) is None  # not retried
    finally:
        failures.close()
