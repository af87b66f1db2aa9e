"""The compile cache heals: a damaged, swapped or vanished entry is compiled again, a folder with
files in an entry's place is named and left alone, what interrupted compiles left is swept away;
and an .onnx compiles into a folder it can write (the models folder's .cache, else the user
cache), or the index says why it cannot."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import aiohttp
import pytest

from aclserve.repository import cache_dir, cache_entry, loader

from .repo_helpers import place, started_on_old_files, x_rows


def _entry(models_dir: Path) -> Path:
    (om,) = (models_dir / ".cache").glob("o-*.om")
    return om


def _empty_folder_for(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["truncate", "swap", "no manifest", "om is an empty folder",
                                    "manifest is an empty folder", "lock is an empty folder"])
async def test_a_bad_cache_entry_is_deleted_and_compiled_again(make_repo, models_dir, model_files, damage):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    om = _entry(models_dir)
    if damage == "truncate":
        om.write_bytes(om.read_bytes()[:100])
    elif damage == "swap":  # another model's OM under this entry's name: must not be served as "o"
        om.write_bytes(Path(model_files[3]["om"]).read_bytes())
    elif damage == "no manifest":
        cache_entry.manifest_path(om).unlink()
    elif damage == "om is an empty folder":  # the compile's rename cannot replace a folder
        _empty_folder_for(om)
    elif damage == "manifest is an empty folder":
        _empty_folder_for(cache_entry.manifest_path(om))
    else:  # a miss takes the entry's lock, whose file cannot be opened where a folder is
        om.unlink()
        (om.parent / f".{om.name}.lock").mkdir()
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    om = _entry(models_dir)
    assert cache_entry.problem(om, json.loads(cache_entry.manifest_path(om).read_text())["key"]) is None
    # readable by replicas running as other users, as the OM is (the manifest was 0600: such a
    # replica deleted the entry as unreadable and compiled it again)
    assert (om.stat().st_mode & 0o777, cache_entry.manifest_path(om).stat().st_mode & 0o777) == (0o644, 0o644)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["om", "manifest"])
async def test_a_folder_with_files_in_place_of_an_entry_is_left_alone_and_named(make_repo, models_dir, model_files,
                                                                               where):
    """Not made by aclserve, so maybe not its to delete: the model is not served, the index says
    why and what to do, and once the folder is gone a load compiles the entry again."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    om = _entry(models_dir)
    blocker = om if where == "om" else cache_entry.manifest_path(om)
    _empty_folder_for(blocker)
    (blocker / "keep.txt").write_text("not aclserve's")
    repo2, _ = await make_repo(model_control_mode="explicit")
    reason = repo2.load_failures()[("o", "1")]
    assert "is a folder with files in it" in reason and "remove it" in reason, reason
    assert (blocker / "keep.txt").read_text() == "not aclserve's"
    (blocker / "keep.txt").unlink()
    blocker.rmdir()
    await repo2.load("o")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_an_entry_removed_by_another_replica_during_the_load_is_compiled_again(make_repo, models_dir,
                                                                                      model_files, monkeypatch):
    """Replicas share the cache, and one retiring a replaced version removes its entry: another
    may have just found that entry for a file put back (a rollback). A load whose entry went
    between the hit and the open compiles it again instead of failing the file for good.
    The other replica's removal is made to land in that window (at the validation)."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    real_validate, removed = loader.validate_om, []

    def validate_while_another_replica_retires_the_entry(path, runtime_kind):
        if not removed:
            removed.append(path)
            cache_entry.remove(path)
        return real_validate(path, runtime_kind)

    monkeypatch.setattr(loader, "validate_om", validate_while_another_replica_retires_the_entry)
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert float((await repo2.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    assert removed == [str(_entry(models_dir))]  # compiled again under the same name


def test_sweep_removes_what_interrupted_compiles_left_unless_a_compile_holds_it(tmp_path):
    """A process gone between an entry's rename and its manifest leaves a full-size .om nobody
    will use (its .onnx may be gone too), and a killed one its lock file: removed at start.
    An entry whose lock is held (a replica compiling it) stays."""
    import fcntl

    from aclserve.repository import entry_locks
    from aclserve.repository.entry_locks import sweep
    a, b, c, d = (f"{m}-{k * 32}.om" for m, k in (("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")))
    (tmp_path / a).write_bytes(b"om")
    (tmp_path / f"{a}.json").write_text("{}")
    (tmp_path / b).write_bytes(b"om" * 1000)  # no manifest: interrupted
    (tmp_path / f".{b}.lock").write_bytes(b"")  # its writer killed holding it
    (tmp_path / c).write_bytes(b"om")  # no manifest yet: a replica is writing it
    (tmp_path / f".{d}.lock").write_bytes(b"")
    (tmp_path / "resnet50.om").write_bytes(b"om")  # the user's own, in a configured cache folder
    held = os.open(tmp_path / f".{c}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweep(tmp_path) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".{c}.lock", a, f"{a}.json", c, "resnet50.om"]
        # the replica finishes it (its manifest) and lets go: what the listing saw is not taken on
        (tmp_path / f"{c}.json").write_text("{}")
        assert entry_locks._remove_if_unfinished(tmp_path / c) is False and (tmp_path / c).exists()
    finally:
        os.close(held)
    (tmp_path / f"{c}.json").unlink()
    assert sweep(tmp_path) == 1  # its holder gone without a manifest: interrupted too
    assert sorted(p.name for p in tmp_path.iterdir()) == [a, f"{a}.json", "resnet50.om"]
    assert sweep(tmp_path / "nope") == 0


def test_an_unwritable_models_folder_compiles_into_the_user_cache(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / ".cache").write_text("a file where the cache folder would be")  # cannot be written
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = cache_dir.resolve("", str(models), env)
    assert folder.parent == tmp_path / "xdg" / "aclserve" / "compile" and folder.name.startswith("models-")
    assert folder.is_dir()
    env = {"XDG_CACHE_HOME": str(models / ".cache" / "x")}  # not writable either
    with pytest.raises(cache_dir.CacheUnavailable, match="set compile_cache_dir to a writable folder"):
        cache_dir.resolve("", str(models), env)
    with pytest.raises(cache_dir.CacheUnavailable, match="compile_cache_dir"):
        cache_dir.resolve(str(models / ".cache" / "sub"), str(models), env)


def test_a_home_that_is_no_folder_is_not_made_for_the_user_cache(tmp_path):
    """The CPU image's user has /nonexistent for its home: a server run there as root with a
    read-only models folder made /nonexistent/.cache (a tester, t84). It is not made; why not is said."""
    models = tmp_path / "models"
    models.mkdir()
    (models / ".cache").write_text("a file where the cache folder would be")  # cannot be written
    home = tmp_path / "nonexistent"
    with pytest.raises(cache_dir.CacheUnavailable) as refused:
        cache_dir.resolve("", str(models), {"HOME": str(home)})
    assert not home.exists()
    assert str(refused.value) == (
        f"cannot compile .onnx models: {models / '.cache'} is not writable (File exists), and there is no user "
        f"cache folder to compile into instead: the home folder {home} (HOME) does not exist (it is not made); set "
        "compile_cache_dir to a writable folder, or XDG_CACHE_HOME")
    home.write_text("")
    with pytest.raises(cache_dir.CacheUnavailable, match=f"the home folder {home} \\(HOME\\) is not a folder"):
        cache_dir.resolve("", str(models), {"HOME": str(home)})
    # XDG_CACHE_HOME is the user's word for where: made if need be
    folder = cache_dir.resolve("", str(models), {"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert folder.is_dir() and folder.parent == tmp_path / "xdg" / "aclserve" / "compile"


@pytest.mark.asyncio
async def test_a_relative_models_folder_compiles_into_its_cache_named_as_its_sources_are(
        make_repo, models_dir, model_files, monkeypatch, caplog):
    """With a relative models folder (`aclserve serve`'s default, `models`) the compile's line mixed
    an absolute source with a relative entry, `o: compiling /.../models/o.onnx for cpu into
    models/.cache/o-<key>.om` (a tester's find); the README shows both absolute."""
    monkeypatch.chdir(models_dir.parent)
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    caplog.set_level(logging.INFO, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit", models_dir=models_dir.name)
    assert float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    compiling = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert compiling == [f"o: compiling {models_dir / 'o.onnx'} for cpu into {_entry(models_dir)}"]
    assert repo.get("o").om_path == str(_entry(models_dir))


@pytest.mark.asyncio
async def test_an_onnx_model_without_a_writable_cache_says_why(make_repo, models_dir, model_files):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / "blocker").write_text("")
    repo, _ = await make_repo(model_control_mode="explicit", compile_cache_dir=str(models_dir / "blocker" / "c"))
    assert "cannot write the compile cache folder" in repo.load_failures()[("o", "1")]


@pytest.mark.asyncio
async def test_the_index_says_where_the_user_cache_fallback_was_tried(models_dir, model_files, tmp_path, monkeypatch):
    """The index's reason for an .onnx that no cache folder can take read "...neither is
    models-fdcdfbdd8767 (...)": paths are redacted from what clients read, and the fallback, a
    folder the redactor knows, was cut to its last name, saying not where it was (a review of
    the deploy files). It is named from the user cache folder on now, which is said in words."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / ".cache").write_text("a file where the cache folder would be")
    (tmp_path / "blocker").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocker" / "cache"))  # not writable either
    runner, _, base, _, _ = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                (row,) = [r for r in await resp.json() if r["name"] == "o"]
    finally:
        await runner.cleanup()
    folder = cache_dir.user_cache_folder(str(models_dir)).name
    assert row["state"] == "UNAVAILABLE" and str(tmp_path) not in row["reason"], row
    assert (f"neither is aclserve/compile/{folder} in the user cache folder cache ($XDG_CACHE_HOME, else ~/.cache: "
            f"Not a directory)") in row["reason"], row["reason"]
