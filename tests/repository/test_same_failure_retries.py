"""Which repeated warm-up failures stop the automatic retries (repository/retry.py warm_up_failure):
the same run failing with the same code and the device's same words at three attempts in a row or
more, the first of them at least `load_retry_max_s` before the last, is the model's failure; an
injected device fault is retried as before, unless it repeats identically that long (its count
says so), and so is one that fails the same way three times within `load_retry_max_s` (a device
fault lasting a few seconds)."""
from __future__ import annotations

import re

import pytest

from aclserve.acl.cpu import faults

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
