"""Load calls arriving together share a scan of the folder: each rescanned it under the scan
lock, so loading every model of a 300-model folder took 44 s (O(N^2)), whatever
load_concurrency said (found by an independent check of the repository at scale). Load calls
of one bad model made together each say why it failed."""
from __future__ import annotations

import asyncio

import pytest

from aclserve.repository import State
from aclserve.repository.repository import ModelLoadFailed

from .repo_helpers import place
from .test_repository import answer

pytestmark = pytest.mark.asyncio


async def test_load_calls_made_together_share_the_scans(make_repo, models_dir, model_files):
    names = [f"m{i}" for i in range(12)]
    for name in names:
        place(model_files[1]["om"], models_dir / f"{name}.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    for name in names:
        await repo.unload(name)
    scans = [0]
    rescan = repo._planner.rescan

    async def counted():
        scans[0] += 1
        return await rescan()
    repo._planner.rescan = counted
    await asyncio.gather(*(repo.load(name) for name in names))
    assert {r["name"]: r["state"] for r in repo.index()} == {name: State.READY for name in names}
    assert scans[0] < len(names), scans[0]  # (one each before; here about 2: the first, then the rest)


async def test_a_load_sees_a_file_placed_before_it_was_asked(make_repo, models_dir, model_files):
    """A load after a change still scans: only a scan begun after the call is reused."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[2]["om"], models_dir / "m.om")
    await repo.load("m")
    assert await answer(repo, "m") == 2.0


@pytest.mark.parametrize("mode", ["explicit", "poll"])
async def test_load_calls_of_a_bad_model_made_together_each_say_why(make_repo, models_dir, mode):
    """Each call forgets the model's refused files, to try them again: forgotten before it waited
    for the scan lock, a load task of another call ending meanwhile refused them again, and the
    call answered "no version loaded" (found by an independent check)."""
    repo, _ = await make_repo(model_control_mode=mode)
    (models_dir / "bad.om").write_bytes(b"garbage" * 100)
    for _ in range(3):
        outcomes = await asyncio.gather(*(repo.load("bad") for _ in range(3)), return_exceptions=True)
        for outcome in outcomes:
            assert isinstance(outcome, ModelLoadFailed), outcome
            assert str(outcome) == "failed to load bad: version 1: not an OM file (neither a CPU OM nor an ATC 'IMOD' header)"
