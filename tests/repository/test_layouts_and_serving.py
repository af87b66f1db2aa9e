"""ModelRepository on the CPU runtime serving what the models folder holds: flat and
versioned layouts, the version policy, every gear's answers, slots (auto or a model file's), a
max_batch_size past the largest gear said, an .om beside its .onnx, a dropped .onnx compiled and cached."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from aclserve.errors import NotFound
from aclserve.repository import State
from aclserve.repository.served import auto_slots

from .repo_helpers import answer, place, serving

pytestmark = pytest.mark.asyncio


async def test_start_loads_both_layouts_and_serves(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "flat.om")
    place(model_files[2]["om"], models_dir / "multi" / "1" / "model.om")
    place(model_files[3]["om"], models_dir / "multi" / "2" / "model.om")
    repo, events = await make_repo(model_control_mode="none")
    assert serving(repo) == ["flat", "multi"]
    assert repo.all_ready()
    assert await answer(repo, "flat") == 1.0
    assert await answer(repo, "multi") == 3.0  # latest 1
    served = repo.get("multi")
    assert (served.version, served.max_batch_size, served.gears) == ("2", 4, (1, 2, 4))
    assert [len(i.slots) for i in served.pool.instances] == [auto_slots("cpu")]  # slots: auto
    assert [s.name for s in served.inputs] == ["x"] and [s.name for s in served.outputs] == ["y"]
    with pytest.raises(NotFound):
        repo.get("nope")
    with pytest.raises(NotFound):
        repo.get("flat", "7")
    index = {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}
    assert index[("flat", "1")] == (State.READY, "")
    assert index[("multi", "2")] == (State.READY, "")
    assert index[("multi", "1")] == (State.UNAVAILABLE, "not selected by the version policy")
    with pytest.raises(NotFound, match="^model multi version 1 is not selected by its version_policy$"):
        repo.get("multi", "1")  # (it said "has no version 1", the index "not selected")
    assert {(r["name"], r["version"]) for r in repo.index(ready_only=True)} == {("flat", "1"), ("multi", "2")}
    assert {e[0] for e in events.seen} == {"loaded"}
    assert all(e[3]["seconds"] > 0 for e in events.seen)


async def test_version_policy_all_serves_each_version(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\nbatching: {max_queue_delay_ms: 0}\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert await answer(repo, "m", "1") == 1.0
    assert await answer(repo, "m", "2") == 2.0
    assert await answer(repo, "m") == 2.0
    assert repo.get("m", "2").config.batching.max_queue_delay_ms == 0


async def test_answers_are_right_for_every_gear(make_repo, models_dir, model_files):
    place(model_files[3]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="none")
    for rows in (1, 2, 3, 4):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        result = await repo.get("m").infer({"x": x}, rows)
        np.testing.assert_array_equal(result.outputs["y"], x * 3)


async def test_slots_auto_is_one_on_a_cpu_runtime_confined_to_one_core(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "flat.om")
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})  # as under `taskset -c N aclserve serve`
    try:
        repo, _ = await make_repo(model_control_mode="none")
        slots = [len(i.slots) for i in repo.get("flat").pool.instances]
        assert auto_slots("cpu") == 1 and auto_slots("npu") == 2
    finally:
        os.sched_setaffinity(0, saved)
    assert slots == [1]
    assert await answer(repo, "flat") == 1.0
    if len(saved) >= 2:
        assert auto_slots("cpu") == 2


async def test_slots_from_a_model_file_win_over_auto(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "two.om")
    (models_dir / "two.yaml").write_text("slots: 2\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert [len(i.slots) for i in repo.get("two").pool.instances] == [2]
    assert await answer(repo, "two") == 1.0


async def test_a_max_batch_size_above_the_largest_gear_is_said(make_repo, models_dir, model_files, caplog):
    """Served as the largest gear (4 here), as before, but no longer in silence (an operator's check).
    An .om's sizes were fixed by ATC: the note told its owner "compile.batch sets the sizes", and
    its config's `compile:` was passed over in silence (an audit's findings): said once. The model's
    own max_batch_size (its requests of more rows refused) in a WARNING, model_defaults' at INFO."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("batching:\n  max_batch_size: 100\ncompile: {batch: [1, 2, 8]}\n")
    place(model_files[1]["om"], models_dir / "inherits.om")
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.batching.max_batch_size": 50})
    assert repo.get("m").max_batch_size == 4
    said = [r.getMessage() for r in caplog.records]
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    fixed = "(an .om's batch sizes were fixed when it was compiled: ATC's --dynamic_batch_size)"
    assert levels.get("m:1: batching.max_batch_size 100 is above the largest compiled batch size 4: a batch holds 4 "
                      f"rows at most, and a request of more is refused {fixed}") == "WARNING", said
    assert levels.get("inherits:1: batching.max_batch_size 50 (model_defaults', or --max-batch) is above the "
                      "largest compiled batch size 4: a batch holds 4 rows at most, and a request of more is refused "
                      f"{fixed}") == "INFO", said
    assert ("models folder: m.yaml: compile is ignored for m.om: an .om was compiled already (its batch sizes "
            "were fixed by ATC); compile applies to an .onnx the server compiles") in said, said
    assert not [line for line in said if "compile.batch" in line]


async def test_om_beside_onnx_wins(make_repo, models_dir, model_files):
    place(model_files[2]["onnx"], models_dir / "m.onnx")
    place(model_files[3]["om"], models_dir / "m.om")
    repo, _ = await make_repo(model_control_mode="none")
    assert await answer(repo, "m") == 3.0
    assert not (models_dir / ".cache").exists()


async def test_dropped_onnx_is_compiled_cached_and_served(make_repo, models_dir, model_files, runtime, caplog):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    (models_dir / "o.yaml").write_text("compile: {batch: [1, 2]}\n")
    caplog.set_level(logging.INFO, logger="aclserve.repository.compiler")
    repo, _ = await make_repo(model_control_mode="explicit")
    assert await answer(repo, "o") == 2.0
    assert repo.get("o").gears == (1, 2)
    cached = sorted(os.listdir(models_dir / ".cache"))
    assert len(cached) == 2 and cached[0].endswith(".om") and cached[1] == cached[0] + ".json"  # + manifest
    compiling = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]  # one line, not two
    assert compiling == [f"o: compiling {models_dir / 'o.onnx'} for cpu into {models_dir / '.cache' / cached[0]}"]
    await repo.close()
    caplog.clear()
    repo2, _ = await make_repo(model_control_mode="explicit")  # same content + options: cache hit
    assert await answer(repo2, "o") == 2.0
    assert sorted(os.listdir(models_dir / ".cache")) == cached
    assert any("using cached compile" in r.getMessage() for r in caplog.records)
    assert not any(r.getMessage().endswith("(ATC not used)") for r in caplog.records)
