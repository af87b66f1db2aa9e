"""make_repo's start-up wait (conftest.py, repo_helpers.until_settled) ends once every model has
settled, READY or failed, whatever the readiness: a model whose load failed emits its last event
before its task ends, and the wait, woken by events only, heard none after that and ran to its
120 s guard (a folder of refused files only, a warm-up failing, a load failing again at its first
retry; under strict readiness, any failed model). It still waits for every model that loads."""
from __future__ import annotations

import pytest

from aclserve.repository import State

from .repo_helpers import place, serving

pytestmark = pytest.mark.asyncio

NOT_AN_OM = b"not an OM file " * 64


async def test_a_folder_of_one_refused_file_is_settled(make_repo, models_dir):
    (models_dir / "bad.om").write_bytes(NOT_AN_OM)
    repo, _ = await make_repo()
    (row,) = repo.index()
    assert (row["name"], row["state"]) == ("bad", State.UNAVAILABLE.value), row
    assert not repo.all_ready()  # (lenient readiness needs one model serving)


async def test_strict_readiness_with_a_refused_model_is_settled_and_the_other_serves(make_repo, models_dir,
                                                                                    model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "bad.om").write_bytes(NOT_AN_OM)
    repo, _ = await make_repo(readiness="strict")
    states = {row["name"]: row["state"] for row in repo.index()}
    assert states == {"bad": State.UNAVAILABLE.value, "m": State.READY.value}, repo.index()
    assert serving(repo) == ["m"] and not repo.all_ready()


async def test_a_failed_warm_up_is_settled(make_repo, models_dir, model_files, clean_faults):
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("execute", code=145000)  # every run fails: the warm-up's too
    repo, _ = await make_repo()
    (row,) = repo.index()
    assert row["state"] == State.UNAVAILABLE.value and "the warm-up run failed" in row["reason"], row


async def test_a_load_failing_again_at_its_first_retry_is_settled(make_repo, models_dir, model_files, clean_faults):
    from aclserve.acl.cpu import faults
    place(model_files[1]["om"], models_dir / "m.om")
    faults.inject("load", code=207001)  # device memory allocation failed (transient), every load
    repo, _ = await make_repo(load_retry_initial_s=0.2, load_retry_max_s=0.4)
    assert repo.load_retries["m"] >= 1  # its first retry is not still to come
    (row,) = repo.index()
    assert row["state"] == State.UNAVAILABLE.value and "transient device error" in row["reason"], row
