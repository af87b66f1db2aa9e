"""A reload loads beside the version it replaces, so on a device near its stream limit raising
`instances` is refused though the new configuration alone would fit: the refusal says why and
what to do (it advised "lower instances or slots", found by an independent check). Only the
model's own serving version holding what it lacks, no other model's unload makes room: it is not
retried (it was, every load_retry_max_s with a WARNING, for good; a review, r33)."""
from __future__ import annotations

import pytest

from .repo_helpers import place, write_in

pytestmark = pytest.mark.asyncio


@pytest.fixture
def runtime():
    """A CPU runtime whose device allows 12 streams: 3 of its own, 4 per instance."""
    from aclserve.runtime import AclRuntime
    rt = AclRuntime(device="cpu", device_limits=(12, None)).start()
    yield rt
    rt.close()


@pytest.mark.parametrize("kind", ["om", "onnx"])  # (the .onnx: refused before its compile, in the same words)
async def test_a_reload_that_fits_alone_but_not_beside_its_predecessor_says_so(make_repo, models_dir, model_files,
                                                                               kind):
    place(model_files[1][kind], models_dir / f"m.{kind}")
    repo, events = await make_repo()
    write_in(models_dir / "m.yaml", "instances: 2\n")
    await events.wait("load_failed", "m")
    ((state, reason),) = [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "m"]
    assert state == "READY" and reason.startswith("serving the previous config; the new one failed: model m:1 "
                                                  "(2 instance(s) x 2 slots) needs 8 streams")
    assert reason.endswith("; a reload loads beside the serving version it replaces, whose instances hold theirs "
                           "until the swap: if the new configuration fits alone, unload the model first"), reason
    assert repo.load_failures()[("m", "1")].endswith("unload the model first")  # (no retry planned)
    await repo.unload("m")
    await repo.load("m")  # alone it fits
    assert len(repo.get("m").pool.instances) == 2


@pytest.mark.parametrize("policy, advice", [
    # a new version number taking over: as a reload (no hint was given; found by an independent check)
    ("{latest: 1}", "; a new version loads beside the serving version it replaces, whose instances hold theirs "
                  "until the swap: if the new configuration fits alone, unload the model first"),
    # served beside the others, it replaces none: unloading first would not make both fit (the
    # advice was given all the same; found by an independent review)
    ("all", None),
])
async def test_a_new_version_that_does_not_fit_beside_the_serving_one_says_what_helps(
        make_repo, models_dir, model_files, policy, advice):
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    (models_dir / "vm" / "config.yaml").write_text(f"instances: 2\nversion_policy: {policy}\n")
    repo, events = await make_repo()
    place(model_files[2]["om"], models_dir / "vm" / "2" / "model.om")
    await events.wait("load_failed", "vm")
    rows = {r["version"]: (r["state"], r["reason"]) for r in repo.index() if r["name"] == "vm"}
    assert rows["1"] == ("READY", "") and rows["2"][0] == "UNAVAILABLE" and "needs 8 streams" in rows["2"][1]
    if advice:  # (not retried: only version 1 holds what it lacks)
        assert rows["2"][1].endswith(advice), rows["2"][1]
    else:
        assert "unload" not in rows["2"][1] and "retry" not in rows["2"][1], rows["2"][1]
