"""A model's settings that cannot apply to the model loaded, or to the host: the load fails with
the reason in the index, or the log names what is passed over (found by an independent check)."""
from __future__ import annotations

import pytest

from aclserve.repository import State

from .repo_helpers import place, serving

pytestmark = pytest.mark.asyncio


def index_of(repo) -> dict:
    return {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}


async def test_a_device_the_host_has_not_fails_the_load_whatever_the_instances(make_repo, models_dir, model_files,
                                                                                runtime):
    """`devices: [0, 5]` with one instance loaded READY on a host of one device (/config showing
    devices "0,5") and failed only once an instance was placed on device 5."""
    count = runtime.device_count()
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text(f"devices: [0, {count + 3}]\ninstances: 1\n")
    place(model_files[1]["om"], models_dir / "fits.om")
    (models_dir / "fits.yaml").write_text(f"devices: {list(range(count))}\ninstances: 1\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["fits"]
    state, reason = index_of(repo)[("m", "1")]
    assert state == State.UNAVAILABLE and f"devices [0, {count + 3}]: this host has no device {count + 3}" in reason
