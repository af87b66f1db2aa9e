"""A warm-up whose execution hangs on the device is bounded by the model's own
`execution_timeout_ms`, like any batch it serves: the load fails naming that timeout, not after
the pool's 60 s default. The instance it hung on is abandoned (the device still runs its work),
and the load is not retried while it is: each attempt left one more. Once the device lets go,
the retry comes. The execution is held by a CPU-runtime fault until the test lets go; the only
time limit is a hang guard far above the configured timeout and far below 60 s."""
from __future__ import annotations

import asyncio
import re
import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.repository.repository import ModelLoadFailed
from aclserve.runtime import teardown

from .repo_helpers import place

NOT_RETRIED = r"transient device error, not retried: its load left 1 instance\(s\) abandoned on the device"

pytestmark = pytest.mark.asyncio


async def freed() -> None:
    """A hang guard: the abandoned instance is freed once the device lets go of it."""
    for _ in range(3000):
        if teardown.release_recovered() == 0 and teardown.unreleased() == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{teardown.unreleased()} load(s) or instance(s) still on the device")


async def test_a_warm_up_that_hangs_fails_at_the_models_execution_timeout(
        make_repo, models_dir, model_files, clean_faults):
    repo, _ = await make_repo(model_control_mode="explicit")
    (models_dir / "m.yaml").write_text("execution_timeout_ms: 300\nreset_timeout_ms: 200\n")
    place(model_files[1]["om"], models_dir / "m.om")
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)  # the warm-up's first execution never ends on its own
    try:
        # a transient device error, but its instance is abandoned: not retried, so the load API answers 400
        with pytest.raises(ModelLoadFailed, match=r"execution timeout \(300 ms\).*" + NOT_RETRIED):
            await asyncio.wait_for(repo.load("m"), 30)  # a hang guard: the default would wait 60 s
        assert held.entered.is_set() and not gate.is_set()  # failed while the device still held it
    finally:
        gate.set()
        await freed()


async def test_a_load_that_left_an_abandoned_instance_is_retried_once_the_device_lets_go(
        make_repo, models_dir, model_files, clean_faults):
    repo, events = await make_repo(model_control_mode="explicit", load_retry_initial_s=0.05, load_retry_max_s=0.2)
    (models_dir / "m.yaml").write_text("execution_timeout_ms: 300\nreset_timeout_ms: 200\n")
    place(model_files[1]["om"], models_dir / "m.om")
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)  # only the first execution hangs
    try:
        with pytest.raises(ModelLoadFailed, match=NOT_RETRIED):
            await asyncio.wait_for(repo.load("m"), 30)  # a hang guard
        assert held.entered.is_set() and teardown.held() == 1 and repo.load_retries.get("m", 0) == 0
        row = next(r for r in repo.index() if r["name"] == "m")
        assert row["state"] == "UNAVAILABLE" and re.search(NOT_RETRIED, row["reason"]), row
        assert re.search(NOT_RETRIED, repo.load_failures()[("m", "1")])  # (/metrics' reason)
    finally:
        gate.set()  # the device lets go: the instance is freed, then the load is retried, and serves
        await freed()
    await events.until(lambda: ("m", "1") not in repo.load_failures() and repo.all_ready())  # (a hang guard)
    assert repo.load_retries["m"] == 1 and repo.get("m").version == "1"


async def test_a_warm_up_past_the_timeout_names_the_setting_not_the_data(
        make_repo, models_dir, model_files, clean_faults):
    """Its reason ended "(if the model cannot run on zeros, warmup_data: ones ...)", as every
    warm-up failure's did: no data makes a run finish sooner. It names the setting to raise, and
    the slowest run that finished (gear 1's three, before gear 2's first hung). A transient device
    error (a hang on the device ends the same way), not retried while its instance is abandoned."""
    repo, _ = await make_repo(model_control_mode="explicit")
    (models_dir / "m.yaml").write_text("execution_timeout_ms: 300\nreset_timeout_ms: 200\n")
    place(model_files[1]["om"], models_dir / "m.om")
    gate = threading.Event()
    held = faults.inject("execute", nth=4, hold=gate)  # gears 1, 2, 4, three runs each: gear 2's first
    try:
        with pytest.raises(ModelLoadFailed) as refused:
            await asyncio.wait_for(repo.load("m"), 30)  # a hang guard
        assert held.entered.is_set() and not gate.is_set()
    finally:
        gate.set()
        await freed()
    reason = str(refused.value)
    assert "warmup_data" not in reason and "cannot run on zeros" not in reason, reason
    assert "(gear 2)" in reason and "execution timeout (300 ms)" in reason, reason
    assert re.search(r"\(the slowest warm-up run that finished took \d+ ms\); if a run takes longer, raise "
                     r"execution_timeout_ms \(300 ms\) in the model's config \(" + NOT_RETRIED, reason), reason
