"""Reasons the repository gives in its log and index, in words that say what happened (found by
an independent tester's reading of them); real files, the real repository on the CPU runtime."""
from __future__ import annotations

import pytest

from aclserve.repository.repository import ModelLoadFailed

pytestmark = pytest.mark.asyncio


async def test_an_empty_om_is_said_to_be_empty(make_repo, models_dir):
    """It was "not an OM file (neither a CPU OM nor an ATC 'IMOD' header)": true, but an empty
    file has no header to be either."""
    repo, _ = await make_repo(model_control_mode="explicit")
    (models_dir / "m.om").write_bytes(b"")
    with pytest.raises(ModelLoadFailed) as refused:
        await repo.load("m")
    assert str(refused.value) == "failed to load m: version 1: not an OM file: the file is empty (0 bytes)"
    assert [(r["name"], r["reason"]) for r in repo.index()] == [("m", "not an OM file: the file is empty (0 bytes)")]
