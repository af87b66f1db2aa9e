"""A dropped .onnx whose weights are in an external data file (as exporters write models over
2 GB): the weights are part of the model. Found by an independent check: the compile cache's key
hashed the .onnx alone, so a re-export that changed only its .data was served with the old
weights (after a restart too), and a second version with the same graph and other weights was
served with the first one's; a .data file that came after its .onnx was never tried again."""
from __future__ import annotations

import logging
import os
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.repository import external_data

from .repo_helpers import x_rows


def _export(folder, stem: str, scale: float, data_name: str | None = None) -> None:
    """y = x * scale with `scale` an initializer kept in `<data_name>` beside `<stem>.onnx`:
    written to hidden names first, the .data, then the .onnx renamed into place."""
    data_name = data_name or f"{stem}.onnx.data"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    init = numpy_helper.from_array(np.full(4, scale, np.float32), "scale")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "g", [x], [y], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    stage = folder / ".stage"
    stage.mkdir(exist_ok=True)
    onnx.save(model, str(stage / f"{stem}.onnx"), save_as_external_data=True, location=data_name,
              size_threshold=0)
    os.replace(stage / data_name, folder / data_name)
    os.replace(stage / f"{stem}.onnx", folder / f"{stem}.onnx")


async def _answer(repo, name: str, version: str | None = None) -> float:
    return float((await repo.get(name, version).infer(x_rows(), 1)).outputs["y"][0, 0])


def test_a_file_is_read_once_while_it_is_unchanged(tmp_path, monkeypatch):
    """Kept by path: with more files than an LRU of 512 held, every scan read them all again
    (found by a review)."""
    _export(tmp_path, "m", 2.0)
    plain = helper.make_model(helper.make_graph([], "g", [], [])).SerializeToString()
    paths = [str(tmp_path / f"p{i}.onnx") for i in range(600)]
    for path in paths:
        with open(path, "wb") as f:
            f.write(plain)
    reads = []
    real = external_data._has_marker
    monkeypatch.setattr(external_data, "_has_marker", lambda path: reads.append(path) or real(path))
    for _ in range(2):  # two scans of a folder of 601 models
        assert len(external_data.named_files(str(tmp_path / "m.onnx"))) == 1
        assert all(external_data.named_files(path) == () for path in paths)
    assert len(reads) == 601
    reads.clear()
    _export(tmp_path, "m", 3.0, "other.bin")  # a new file: read again
    assert external_data.named_files(str(tmp_path / "m.onnx")) == (str((tmp_path / "other.bin").resolve()),)
    assert reads == [str(tmp_path / "m.onnx")]


@pytest.mark.asyncio
async def test_a_model_gone_from_the_folder_is_forgotten_at_the_scan_that_finds_it_gone(make_repo, models_dir,
                                                                                        monkeypatch):
    """What each path named was kept until 65,536 paths, those gone from the folder too: a server whose
    models were replaced and deleted kept them all (found by a review). Only memory shows it: asked of
    the module. One still there is kept, not read again."""
    for stem in ("gone", "kept"):
        _export(models_dir, stem, 2.0)
    repo, events = await make_repo(model_control_mode="poll")
    gone, kept = (str((models_dir / f"{stem}.onnx").resolve()) for stem in ("gone", "kept"))
    assert {gone, kept} <= set(external_data._known)
    reads = []
    real = external_data._has_marker
    monkeypatch.setattr(external_data, "_has_marker", lambda path: reads.append(path) or real(path))
    for name in ("gone.onnx", "gone.onnx.data"):
        (models_dir / name).unlink()
    await events.wait("unloaded", "gone")
    assert gone not in external_data._known and kept in external_data._known
    assert reads == [] and await _answer(repo, "kept") == 2.0


def test_the_files_named_are_found_and_a_plain_model_is_not_parsed(tmp_path, monkeypatch):
    _export(tmp_path, "m", 2.0, "weights.bin")
    assert external_data.named_files(str(tmp_path / "m.onnx")) == (str((tmp_path / "weights.bin").resolve()),)
    plain = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(helper.make_graph([], "g", [], [])), str(plain))
    monkeypatch.setattr(onnx, "load", lambda *a, **k: pytest.fail("parsed a file that names no external data"))
    assert external_data.named_files(str(plain)) == ()


@pytest.mark.asyncio
async def test_versions_that_differ_in_their_external_data_alone_serve_their_own_weights(make_repo, models_dir):
    for version, scale in (("1", 2.0), ("2", 3.0)):
        (models_dir / "m" / version).mkdir(parents=True)
        _export(models_dir / "m" / version, "model", scale)
    assert (models_dir / "m" / "1" / "model.onnx").read_bytes() == (models_dir / "m" / "2" / "model.onnx").read_bytes()
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert (await _answer(repo, "m", "1"), await _answer(repo, "m", "2")) == (2.0, 3.0)


@pytest.mark.asyncio
async def test_new_weights_in_the_external_data_alone_are_reloaded_and_survive_a_restart(make_repo, models_dir,
                                                                                         caplog):
    """The reload's log line names the weights file (it said "its new file": found by a tester)."""
    _export(models_dir, "m", 2.0)
    repo, events = await make_repo(model_control_mode="poll")
    assert await _answer(repo, "m") == 2.0
    before = (models_dir / "m.onnx").read_bytes()
    stage = models_dir / ".stage"
    _export(stage, "m", 5.0)  # the same graph, other weights: only the .data differs
    assert (stage / "m.onnx").read_bytes() == before
    with caplog.at_level(logging.INFO, logger="aclserve.repository"):
        os.replace(stage / "m.onnx.data", models_dir / "m.onnx.data")
        await events.wait("reloaded", "m")
    assert "m: version 1 reloaded (its new weights file), the one before drains" in caplog.text
    assert await _answer(repo, "m") == 5.0
    await repo.close()
    again, _ = await make_repo(model_control_mode="none")  # the compile cache is keyed by the weights too
    assert await _answer(again, "m") == 5.0


@pytest.mark.asyncio
async def test_an_external_data_file_that_comes_after_its_model_is_loaded_then(make_repo, models_dir):
    _export(models_dir, "m", 2.0)
    os.replace(models_dir / "m.onnx.data", models_dir / ".m.onnx.data.part")  # not there yet
    repo, events = await make_repo(start=False, model_control_mode="poll")
    await repo.start()
    await events.wait("load_failed", "m")
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and "its external data cannot be read (m.onnx.data does not exist)" \
        in row["reason"], row
    os.replace(models_dir / ".m.onnx.data.part", models_dir / "m.onnx.data")
    await events.wait("loaded", "m")
    assert await _answer(repo, "m") == 2.0


@pytest.mark.asyncio
@pytest.mark.parametrize("offset,length,said", [("-5", "64", "its offset '-5'"), ("0", "abc", "its length 'abc'")])
async def test_an_entry_onnx_refuses_is_the_models_reason_said_once(make_repo, models_dir, caplog, offset, length,
                                                                    said):
    """A negative offset or a length that is no integer: onnx's reader raised ValueError out of
    the scan, logged with its traceback at every rescan, and the index said "internal error"."""
    _export(models_dir, "m", 2.0)
    model = onnx.load(str(models_dir / "m.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        entry.value = {"offset": offset, "length": length}.get(entry.key, entry.value)
    onnx.save(model, str(models_dir / ".m.onnx.part"))
    os.replace(models_dir / ".m.onnx.part", models_dir / "m.onnx")
    repo, events = await make_repo(start=False, model_control_mode="poll")
    await repo.start()
    # refused by the compile, or (before) by the scan: no load is tried then, no event comes
    await events.until(lambda: events.count("load_failed", "m") or "could not be scanned" in str(repo.index()))
    reason = f"its external data cannot be read (tensor 'scale': {said} is not a non-negative integer)"
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    with pytest.raises(Exception, match=re.escape(reason)):  # a load call: the folder scanned again
        await repo.load("m")
    assert not [r for r in caplog.records if r.name == "aclserve.repository.layout"], caplog.text


def test_the_files_named_inside_an_if_branch_are_found():
    """Weights in an If branch's initializers and in a Constant's tensor there: both files count."""
    from aclserve.om.external_files import external_locations

    def outside(name: str, location: str) -> onnx.TensorProto:
        tensor = numpy_helper.from_array(np.ones(4, np.float32), name)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=location)
        return tensor

    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    then_graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "then", [], [y],
                                   [outside("w", "then.data")])
    else_graph = helper.make_graph([helper.make_node("Constant", [], ["y"], value=outside("c", "else.data"))],
                                   "else", [], [y])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)
    model = helper.make_model(helper.make_graph([node], "g", [c], [y]))
    assert external_locations(model) == {"then.data", "else.data"}


@pytest.mark.asyncio
@pytest.mark.parametrize("link,said", [("hard", "a hard link (a file with more than one name)"),
                                       ("symbolic", "a symbolic link")])
async def test_a_linked_external_data_file_is_said_to_be_one_to_copy(make_repo, models_dir, link, said):
    """onnx 1.23's checker refuses an external data file that is a hard link or a symbolic link
    (even one into models/.store/, as the README recommends for model files): the reason said
    "invalid ONNX graph: ... indicating a potential hardlink attack" (found by a tester)."""
    if tuple(int(part) for part in onnx.__version__.split(".")[:2]) < (1, 23):
        pytest.skip("onnx before 1.23 reads linked external data files")
    _export(models_dir, "m", 2.0)
    store = models_dir / ".store"
    store.mkdir()
    os.replace(models_dir / "m.onnx.data", store / "weights")
    if link == "hard":
        os.link(store / "weights", models_dir / "m.onnx.data")
    else:
        os.symlink(os.path.join(".store", "weights"), models_dir / "m.onnx.data")
    repo, events = await make_repo(start=False, model_control_mode="none")
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE", row
    assert row["reason"] == (f"{models_dir / 'm.onnx'}: its external data file m.onnx.data is {said}, which onnx's "
                             "checker refuses as a safeguard against link attacks: copy the file there instead"), row
