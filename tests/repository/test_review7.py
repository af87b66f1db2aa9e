"""Found by an operator's review of the repository and the CLI: each test pins one defect."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from aclserve.repository.repository import ModelLoadFailed

from .repo_helpers import serving

pytestmark = pytest.mark.asyncio


async def test_a_load_overtaken_by_an_unload_says_so(make_repo, models_dir, model_files):
    """The unload arrives while the load is scanning: the model ends unloaded (the unload came
    last) and the load's answer names the unload instead of "no version loaded"."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    load, unload = await asyncio.gather(repo.load("m"), repo.unload("m"), return_exceptions=True)
    assert unload is None
    assert isinstance(load, ModelLoadFailed)
    assert "unload" in str(load)
    assert serving(repo) == []


async def test_a_load_behind_an_unload_loads_when_the_unload_is_done(make_repo, models_dir, model_files):
    """load, unload, load at once: the last word is a load, so every load answers success and the
    model serves (explicit mode rescans nothing by itself: a dropped load would stay dropped)."""
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="explicit")
    first, unload, last = await asyncio.gather(repo.load("m"), repo.unload("m"), repo.load("m"),
                                               return_exceptions=True)
    assert unload is None and last is None
    assert first is None, first
    await repo.wait_idle()
    assert serving(repo) == ["m"]
    assert repo.all_ready()
