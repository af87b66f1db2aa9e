"""ModelRepository's start and close: a missing folder stops the start, the start says
whether the folder is empty, still settling or holds only models it refused; a close, idempotent,
frees device memory."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from aclserve.errors import ShuttingDown

from .repo_helpers import place

pytestmark = pytest.mark.asyncio


async def test_missing_models_folder_fails_start(make_repo, tmp_path):
    from aclserve.repository import RepositoryError
    with pytest.raises(RepositoryError, match="does not exist"):
        await make_repo(models_dir=str(tmp_path / "nope"))


async def test_start_says_whether_the_folder_is_empty_or_its_files_are_still_settling(
        make_repo, models_dir, model_files, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository.repository")
    await make_repo()  # nothing in the folder
    assert "holds no model" in caplog.text and "still being written" not in caplog.text
    caplog.clear()
    written = time.time()
    (models_dir / "m.om").write_bytes(Path(model_files[3]["om"]).read_bytes())  # fresh: not trusted yet
    await make_repo(wall_clock=lambda: written)  # (fresh however late it starts) waits until m is served
    assert "still being written" in caplog.text and "holds no model" not in caplog.text


@pytest.mark.parametrize("names, listed", [(["m"], "m"),
                                           ([f"m{i}" for i in range(7)], "m0, m1, m2, m3, m4 and 2 more")])
async def test_start_says_the_folder_holds_models_it_refused_not_that_it_holds_none(
        make_repo, models_dir, model_files, caplog, names, listed):
    """digits.om beside a digits.yaml naming a labels file that is missing: "holds no model" was
    said of a folder holding one, refused (tester t51). Past five the line said "m0, ..., m4, ..."
    where every other list of names says how many more."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.repository")
    for name in names:
        place(model_files[1]["om"], models_dir / f"{name}.om")
        (models_dir / f"{name}.yaml").write_text("outputs:\n  y: {labels: missing_labels.txt}\n")
    await make_repo(wall_clock=lambda: time.time() + 60)  # (files a minute old: trusted at once)
    assert "holds no model" not in caplog.text
    assert (f"the models folder {models_dir} holds {len(names)} model(s) it cannot serve as they are ({listed}: each "
            "one's reason is logged above and in the repository index); the server is up but has nothing to "
            "serve") in caplog.text


async def test_close_is_idempotent_and_frees_device_memory(make_repo, models_dir, model_files, runtime):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(model_control_mode="none")
    used_loaded = runtime.memory(refresh=True)[0]["used"]
    await repo.close()
    await repo.close()
    assert runtime.memory(refresh=True)[0]["used"] < used_loaded
    assert events.count("unloaded", "m") == 1
    with pytest.raises(ShuttingDown):
        repo.get("m")
