"""Links in the compile cache are not followed (an independent tester's finds, against the
README's rule that the models folder is the limit of what the server opens): `models/.cache` a
link to a folder outside had every compile and manifest written there; an entry's .om made a link to another
model's OM elsewhere, its manifest's om_sha256 and om_size set to match, was served as the model."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from aclserve.repository import cache_dir, cache_entry

from .repo_helpers import place, x_rows

pytestmark = pytest.mark.asyncio


async def answer(repo, name: str) -> float:
    return float((await repo.get(name).infer(x_rows(), 1)).outputs["y"][0, 0])


async def test_a_models_folder_cache_leading_outside_is_not_used(make_repo, models_dir, model_files, tmp_path,
                                                                 monkeypatch, caplog):
    """The user cache folder takes the compiles instead (as for a read-only models folder), said
    in one WARNING line; a compile_cache_dir the operator sets through the same link is theirs."""
    caplog.set_level(logging.WARNING, logger="aclserve.repository")
    outside = tmp_path / "outside"
    outside.mkdir()
    stray = outside / f"q-{'0' * 32}.om"  # named as an entry left without its manifest: the start's sweep takes those
    stray.write_bytes(b"not aclserve's")
    os.symlink(outside, models_dir / ".cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    place(model_files[3]["onnx"], models_dir / "p.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    assert (await answer(repo, "o"), await answer(repo, "p")) == (2.0, 3.0)
    assert os.listdir(outside) == [stray.name]
    fallback = cache_dir.user_cache_folder(str(models_dir))
    assert len(list(fallback.glob("o-*.om"))) == 1 and repo.get("o").om_path.startswith(str(fallback))
    warned = [r.getMessage() for r in caplog.records if "leads outside the models folder" in r.getMessage()]
    assert warned == [f"{models_dir / '.cache'} leads outside the models folder (to {outside}), not used: compiling "
                      f".onnx models into {fallback}"], warned
    await repo.close()
    chosen, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(models_dir / ".cache"))
    assert await answer(chosen, "o") == 2.0 and len(list(outside.glob("o-*.om"))) == 1


@pytest.mark.parametrize("linked", ["om", "manifest", "lock"])
async def test_a_cache_entry_file_that_is_a_link_is_not_followed(make_repo, models_dir, model_files, tmp_path,
                                                                 linked):
    """An .om or manifest that is a link is not used: the link alone is removed (what it leads
    to is left as it is) and the model compiled again; a lock file that is a link is not opened
    (its open would make the file it names)."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    (om,) = (models_dir / ".cache").glob("o-*.om")
    manifest = cache_entry.manifest_path(om)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if linked == "om":  # another model's OM, the manifest made to match it
        foreign = Path(shutil.copy(model_files[3]["om"], elsewhere / "other.om"))
        data = foreign.read_bytes()
        record = json.loads(manifest.read_text())
        manifest.write_text(json.dumps(dict(record, om_sha256=hashlib.sha256(data).hexdigest(), om_size=len(data))))
        om.unlink()
        os.symlink(foreign, om)
        untouched = {foreign: data}
    elif linked == "manifest":  # a sound manifest of the entry, kept elsewhere
        foreign = Path(shutil.copy(manifest, elsewhere / "other.json"))
        manifest.unlink()
        os.symlink(foreign, manifest)
        untouched = {foreign: foreign.read_bytes()}
    else:
        cache_entry.remove(om)  # a miss takes the lock
        os.symlink(elsewhere / "made", om.parent / f".{om.name}.lock")
        untouched = {}
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo2, "o") == 2.0
    assert not om.is_symlink() and not manifest.is_symlink()
    assert cache_entry.problem(om, json.loads(manifest.read_text())["key"]) is None
    assert {path: path.read_bytes() for path in untouched} == untouched
    assert sorted(os.listdir(elsewhere)) == sorted(path.name for path in untouched)
