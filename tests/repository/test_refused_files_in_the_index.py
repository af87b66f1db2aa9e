"""Files the repository does not serve, in its index and in what a request naming them is
told: bad files and configs refused for good (404), a version not loaded yet (503), a link out of
the folder."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aclserve.errors import ModelUnavailable, NotFound
from aclserve.repository import State

from .repo_helpers import answer, place, serving

pytestmark = pytest.mark.asyncio


async def test_bad_files_on_disk_show_in_the_index(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "good.om")
    (models_dir / "junk.om").write_bytes(b"this is not a model")
    (models_dir / "badcfg.om").write_bytes(Path(model_files[1]["om"]).read_bytes())
    (models_dir / "badcfg.yaml").write_text("slots: 0\n")
    (models_dir / "bad name.om").write_bytes(b"x")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == ["good"]
    assert repo.all_ready()  # lenient: refused files show in the index but do not hold readiness back
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert index[("junk", "1")][0] == State.UNAVAILABLE and "not a loadable OM" in index[("junk", "1")][1]
    assert "slots: must be >= 1" in index[("badcfg", "")][1]
    assert index[("bad name.om", "")][0] == State.UNAVAILABLE
    assert events.count("load_failed", "junk") == 1
    # refused for good (no retry is due): 404, as Triton's "has no available versions", not a
    # 503 a client would retry forever
    with pytest.raises(NotFound, match=r"model junk has no available versions \(.*not a loadable OM"):
        repo.get("junk")
    with pytest.raises(NotFound, match=r"model junk version 1 is not available \(.*not a loadable OM"):
        repo.get("junk", "1")
    # so is a model whose files cannot be served as they are (its config broken): it was a 503
    # without a version, and "unknown model" with one, though the index lists it (a helper)
    with pytest.raises(NotFound, match=r"model badcfg has no available versions \(.*slots: must be >= 1"):
        repo.get("badcfg")
    with pytest.raises(NotFound, match=r"model badcfg version 1 is not available \(.*slots: must be >= 1"):
        repo.get("badcfg", "1")


async def test_a_version_on_disk_not_loaded_yet_is_unavailable_not_unknown(make_repo, models_dir, model_files):
    """A version folder the scan found and the policy selects, still settling: the index lists it
    UNAVAILABLE, and a request naming it is told so (503, retry later), not 404 "no version"
    as for a version that does not exist."""
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    for path in (models_dir / "m" / "1" / "model.om", models_dir / "m" / "config.yaml"):
        os.utime(path, (1, 1))  # old files: taken at once at start
    repo, _ = await make_repo(model_control_mode="poll", settle_s=30)
    (models_dir / "m" / "2").mkdir()
    (models_dir / "m" / "2" / "model.om").write_bytes(Path(model_files[2]["om"]).read_bytes())  # written in place
    for _ in range(3000):  # a hang guard, not a timing
        if any(r["version"] == "2" for r in repo.index()):
            break
        await asyncio.sleep(0.01)
    (row,) = [r for r in repo.index() if r["version"] == "2"]
    assert (row["state"], row["reason"]) == (State.UNAVAILABLE, "waiting for the file to be complete")
    # (the index's reason, which a request was not told: "not loaded", test_settling_request_reason.py)
    with pytest.raises(ModelUnavailable, match=r"model m version 2 is not ready \(UNAVAILABLE: waiting for the file"):
        repo.get("m", "2")
    with pytest.raises(NotFound, match="model m has no version 3"):
        repo.get("m", "3")
    assert await answer(repo, "m", "1") == 1.0


async def test_symlink_outside_the_repository_is_never_loaded(make_repo, models_dir, model_files, tmp_path):
    os.symlink(model_files[1]["om"], models_dir / "escape.om")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == []
    # refused: the start's one failed load of the model (problem_loads.py), nothing loaded
    assert [(event, name, version) for event, name, version, _ in events.seen] == [("load_failed", "escape", "")]
    assert any(r["name"] == "escape" and "outside" in r["reason"] for r in repo.index())
