"""Which repeated warm-up failures stop the automatic retries (repository/retry.py warm_up_failure):
the same run failing with the same code and the device's same words at three attempts in a row is
the model's failure; an injected device fault is retried as before, unless it repeats identically
that often (its count says so)."""
from __future__ import annotations

import pytest

from aclserve.acl.cpu import faults

from tests.tiny_models import compile_cpu_om, scale_onnx

from .repo_helpers import serving


@pytest.mark.asyncio
async def test_only_the_same_failure_of_the_same_run_three_times_stops_the_retries(make_repo, models_dir,
                                                                                 tmp_path, clean_faults):
    """`same` fails its first warm-up run 507011 three times in a row; `moving` fails three times too,
    at another run each time (runs 1, 2 and 3 of gear 1), as a device fault striking anywhere does."""
    src = scale_onnx(tmp_path / "scale.onnx", 2.0)
    for name in ("same", "moving"):
        compile_cpu_om(src, models_dir / f"{name}.om", batch="1,2")
    faults.inject("execute", model="same", count=3)  # the header's name: each attempt's first run
    for nth in (1, 3, 6):  # (each fault counts the model's runs since it was injected)
        faults.inject("execute", model="moving", nth=nth, count=1)
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=0.1)
    await repo.start()
    await events.wait("loaded", "moving", limit_s=60)  # (a hang guard)
    def reason() -> str:
        return next(r["reason"] for r in repo.index() if r["name"] == "same")
    await events.until(lambda: "not retried" in reason(), limit_s=60)  # (a hang guard: it loads at its 4th try)
    assert repo.load_retries["moving"] == 3 and repo.load_retries["same"] == 2
    assert "failed with 507011" in reason() and "(failed the same way 3 times in a row" in reason(), reason()
    assert serving(repo) == ["moving"]
