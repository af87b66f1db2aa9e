"""The compile cache stays bounded: each entry's manifest lists the model files compiled or loaded
from it, and an entry none of them is left for goes (an independent tester found entries
orphaned for good: a model unloaded through the API whose file was then deleted; a file replaced
while the server was down, each revision leaving a full-size OM beside the new one). What another
server may be using or writing (its lock held), what only cannot be reached now, and entries made
before manifests listed their files are left alone."""
from __future__ import annotations

import json
import logging

import pytest

from aclserve.repository import cache_entry
from aclserve.repository.entry_locks import exclusive

from .repo_helpers import place, x_rows

pytestmark = pytest.mark.asyncio


async def answer(repo, name: str) -> float:
    return float((await repo.get(name).infer(x_rows(), 1)).outputs["y"][0, 0])


def entries(cache, name: str) -> list[str]:
    return sorted(path.name for path in cache.glob(f"{name}-*"))


@pytest.mark.parametrize("mode", ["poll", "explicit"])
async def test_an_unloaded_models_compile_goes_once_its_file_is_deleted(make_repo, models_dir, model_files, caplog,
                                                                        mode):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[2]["onnx"], models_dir / "d.onnx")
    repo, events = await make_repo(model_control_mode=mode)
    assert await answer(repo, "d") == 2.0
    await repo.unload("d")
    cache = models_dir / ".cache"
    assert len(entries(cache, "d")) == 2  # its file stays: loaded again, it uses its compile
    (models_dir / "d.onnx").unlink()
    if mode == "poll":
        place(model_files[1]["om"], models_dir / "gate.om")  # a scan after the deletion, as a gate
        await events.wait("loaded", "gate")
    else:
        await repo.index_now()  # (explicit mode reads the folder for it, as a load call does)
    assert entries(cache, "d") == []
    said = [r.getMessage() for r in caplog.records if "no model file uses now" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("compile cache: removed 1 compile ") and "(d-" in said[0], said


async def test_a_file_replaced_while_the_server_was_down_leaves_one_compile(make_repo, models_dir, model_files):
    """The Kubernetes pattern: the volume updated, the pods restarted."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo, "o") == 2.0
    await repo.close()
    place(model_files[3]["onnx"], models_dir / "o.onnx")
    repo2, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo2, "o") == 3.0
    (om,) = (models_dir / ".cache").glob("o-*.om")
    assert repo2.get("o").om_path == str(om) and len(entries(models_dir / ".cache", "o")) == 2  # (.om + manifest)


async def test_a_sweep_leaves_what_another_server_holds_and_what_it_cannot_judge(make_repo, models_dir, model_files):
    """At the start, three files deleted while the server was down: the compile of one goes;
    another's lock is held (a server compiling it, or tidying it, now): kept; the third's
    manifest lists no files (made before manifests did): kept, nothing to judge it by."""
    for name in ("o", "p", "q"):
        place(model_files[2]["onnx"], models_dir / f"{name}.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    cache = models_dir / ".cache"
    (p_om,) = cache.glob("p-*.om")
    (q_om,) = cache.glob("q-*.om")
    record = json.loads(cache_entry.manifest_path(q_om).read_text())
    assert record["sources"] == ["../q.onnx"]  # (relative to the cache folder)
    del record["sources"]
    cache_entry.manifest_path(q_om).write_text(json.dumps(record))
    for name in ("o", "p", "q"):
        (models_dir / f"{name}.onnx").unlink()
    with exclusive(cache / f".{p_om.name}.lock"):  # (a flock of its own: another process's, to this server)
        await make_repo(model_control_mode="explicit")
        assert entries(cache, "o") == [] and len(entries(cache, "p")) == len(entries(cache, "q")) == 2


async def test_nothing_is_removed_while_the_models_folder_is_away(make_repo, models_dir, model_files, tmp_path):
    """Its files may be there, only not reached now: an unload meanwhile keeps the compile."""
    folder, cache = models_dir / "m", tmp_path / "cache"
    place(model_files[2]["onnx"], folder / "o.onnx")
    repo, _ = await make_repo(models_dir=str(folder), compile_cache_dir=str(cache))
    assert await answer(repo, "o") == 2.0
    folder.rename(models_dir / "m.away")
    await repo._reconcile(trust="settle")  # (what the watcher's scan does)
    await repo.unload("o")
    assert len(entries(cache, "o")) == 2
    (models_dir / "m.away").rename(folder)
    await repo.load("o")
    assert await answer(repo, "o") == 2.0 and len(entries(cache, "o")) == 2


async def test_compiles_of_one_file_with_other_settings_are_kept_for_whoever_uses_them(make_repo, models_dir,
                                                                                       model_files):
    """Replicas sharing the cache that compile one file differently (other SoCs, other batch lists)
    took the file off each other's entry at each start and removed it, each start compiling again
    (reviewer r21). Compiles of the file's earlier content, with the same settings, still go."""
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    cache = models_dir / ".cache"
    for batch, kept in (([1, 2], 2), ([1, 4], 4), ([1, 2], 4)):  # (each compile with its manifest)
        repo, _ = await make_repo(model_control_mode="explicit", **{"model_defaults.compile.batch": batch})
        assert await answer(repo, "o") == 2.0
        await repo.close()
        assert len(entries(cache, "o")) == kept, entries(cache, "o")
    place(model_files[3]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit", **{"model_defaults.compile.batch": [1, 2]})
    assert await answer(repo, "o") == 3.0
    assert len(entries(cache, "o")) == 4  # the [1, 2] compile of the old content replaced; the [1, 4] one kept
    om = repo.get("o").om_path
    assert sorted(p.name for p in cache.glob("o-*.om")).count(om.rsplit("/", 1)[1]) == 1


async def test_a_sweep_of_many_compiles_names_the_first_few(make_repo, models_dir, model_files, caplog):
    """A cache copied in from another folder (a tester's 160 entries) was named whole in one line."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    cache = models_dir / ".cache"
    (om,) = cache.glob("o-*.om")
    manifest = cache_entry.manifest_path(om)
    for i in range(10):  # its copies under other models' names, whose files are gone
        copy = cache / om.name.replace("o-", f"c{i}-", 1)
        copy.write_bytes(om.read_bytes())
        record = json.loads(manifest.read_text())
        record["sources"] = [f"../c{i}.onnx"]
        cache_entry.manifest_path(copy).write_text(json.dumps(record))
    (models_dir / "o.onnx").unlink()
    await make_repo(model_control_mode="explicit")
    said = [r.getMessage() for r in caplog.records if "no model file uses now" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("compile cache: removed 11 compiles "), said
    assert said[0].endswith(".om and 3 more)") and said[0].count(".om") == 8, said
