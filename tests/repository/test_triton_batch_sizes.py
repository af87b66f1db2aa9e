"""A config.pbtxt's max_batch_size decides the batch sizes an .onnx beside it is compiled with
(config/triton_config.py): Triton runs batches up to it, and a config.pbtxt has no compile.batch
(the compiler's default sizes stop at 32, so 48 or 64 rows were refused with a 400). The sizes
are the default ones below it, it, and dynamic_batching's preferred sizes; model_defaults'
compile.batch, where given, is kept. An .om compiled with fewer is served with a WARNING naming
both (found by a tester migrating a Triton repository). Scans on temporary folders; serving on
the real app, port and CPU runtime."""
from __future__ import annotations

import logging

import aiohttp
import onnx
import pytest

from aclserve.config import ModelConfig, load_server_config
from aclserve.repository import State
from aclserve.repository.compiler import cache_key
from aclserve.repository.layout import scan

from .repo_helpers import place, started_on_old_files, write_in, x_rows


def triton_folder(root, name: str, pbtxt: str, model: str, file: str = "model.onnx") -> None:
    place(model, root / name / "1" / file)
    write_in(root / name / "config.pbtxt", pbtxt)


def test_the_batch_sizes_follow_max_batch_size_and_the_preferred_sizes(tmp_path, model_files):
    onnx = model_files[1]["onnx"]
    for name, pbtxt in (("wide", "max_batch_size: 64\ndynamic_batching { preferred_batch_size: [ 16, 64, 24 ] }\n"),
                        ("twelve", "max_batch_size: 12\n"), ("one", "max_batch_size: 1\n"),
                        ("whole", "max_batch_size: 0\n"),
                        ("above", "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4, 9 ] }\n"),
                        ("many", "max_batch_size: 101\ndynamic_batching { preferred_batch_size: [ "
                                 + ", ".join(map(str, range(1, 102))) + " ] }\n"),
                        # sizes up to ATC's documented 2048 (the sizes past it were compiled, for the
                        # load to refuse at best: its buffers a tester's host memory could hold)
                        ("past", f"max_batch_size: {1 << 30}\ndynamic_batching {{ preferred_batch_size: [ 64, 4096 ] "
                                 "}\n")):
        triton_folder(tmp_path, name, pbtxt, onnx)
    result = scan(tmp_path, ModelConfig())
    batch = {name: entry.config.compile.batch for name, entry in result.models.items()}
    # one size would compile a model without a batch dimension: 1 compiles 1 and 2 (the default sizes took
    # buffers for 32 rows where no batch holds more than 1: a tester's model refused for the device's memory)
    assert batch == {"wide": (1, 2, 4, 8, 16, 24, 32, 64), "twelve": (1, 2, 4, 8, 12), "one": (1, 2), "whole": None,
                     "past": (1, 2, 4, 8, 16, 32, 64, 2048)}
    # the compile cache's key holds them: a changed max_batch_size compiles again
    keys = {cache_key(onnx, result.models[name].config.compile, "cpu") for name in ("wide", "twelve", "one")}
    assert len(keys) == 3
    problems = {name: problem.partition("config.pbtxt: ")[2] for name, problem in result.problems.items()}
    assert problems == {
        "above": "dynamic_batching.preferred_batch_size: 9: must be positive and at most max_batch_size (8; Triton "
                 "refuses it too)",
        "many": "dynamic_batching.preferred_batch_size: with max_batch_size 101 makes 101 batch sizes to compile an "
                ".onnx with: at most 100 are allowed"}
    # model_defaults' compile.batch is the one meant: kept, the preferred sizes passed over
    defaults = load_server_config(None, {"model_defaults.compile.batch": [1, 2, 8]}).model_defaults
    result = scan(tmp_path, defaults)
    assert result.models["wide"].config.compile.batch == (1, 2, 8)
    assert "wide/config.pbtxt: dynamic_batching.preferred_batch_size passed over: batches form at the model's " \
           "compiled batch sizes, which /config lists as preferred_batch_size" in result.notes


@pytest.mark.asyncio
async def test_an_onnx_serves_max_batch_size_rows_and_an_om_below_it_is_warned_of(models_dir, model_files, tmp_path,
                                                                                     caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    triton_folder(models_dir, "wide", "max_batch_size: 64\ndynamic_batching { preferred_batch_size: [ 16, 64 ] }\n",
                  model_files[2]["onnx"])
    triton_folder(models_dir, "twelve", "max_batch_size: 12\ndynamic_batching { }\n", model_files[2]["onnx"])
    triton_folder(models_dir, "one", "max_batch_size: 1\n", model_files[2]["onnx"])
    triton_folder(models_dir, "past", f"max_batch_size: {1 << 30}\n", model_files[2]["onnx"])  # (compiled to 2048)
    # compiled by ATC (here: the tests' CPU compile) with the sizes 1, 2, 4
    triton_folder(models_dir, "om", "max_batch_size: 16\ndynamic_batching { }\n", model_files[1]["om"], "model.om")
    static = tmp_path / "static.onnx"  # x [1, 4]: no batch dimension
    fixed = onnx.load(model_files[1]["onnx"])
    for value in [*fixed.graph.input, *fixed.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(fixed, static)
    triton_folder(models_dir, "static", "max_batch_size: 4\ndynamic_batching { }\n", str(static))
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            shown = {}
            for name in ("wide", "twelve", "om"):
                async with session.get(f"{base}/v2/models/{name}/config") as resp:
                    assert resp.status == 200
                    body = await resp.json()
                    shown[name] = (body["max_batch_size"], body["dynamic_batching"]["preferred_batch_size"])
            answers = {}
            for name, rows in (("wide", 64), ("twelve", 12), ("twelve", 13), ("one", 1), ("one", 2)):
                request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                       "data": x_rows(rows).get("x").ravel().tolist()}]}
                async with session.post(f"{base}/v2/models/{name}/infer", json=request) as resp:
                    answers[name, rows] = (resp.status, await resp.json())
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {r["name"]: r for r in await resp.json()}
        assert shown == {"wide": (64, [1, 2, 4, 8, 16, 32, 64]), "twelve": (12, [1, 2, 4, 8, 12]), "om": (4, [1, 2, 4])}
        status, body = answers["wide", 64]  # one request of 64 rows, one run (was 400: max_batch_size 32)
        assert status == 200 and body["outputs"][0]["shape"] == [64, 4] and set(body["outputs"][0]["data"]) == {2.0}
        status, body = answers["twelve", 12]
        assert status == 200 and body["outputs"][0]["shape"] == [12, 4]
        assert answers["twelve", 13] == (400, {"error": "input 'x': batch size 13 exceeds the model's max_batch_size "
                                                        "12"})
        assert repo.get("twelve").gears == (1, 2, 4, 8, 12)  # (12 rows run at 12, not padded to 16)
        assert repo.get("one").gears == (1, 2)  # (not 1 to 32: buffers for 32 rows where a batch holds 1)
        assert answers["one", 1][0] == 200 and answers["one", 1][1]["outputs"][0]["shape"] == [1, 4]
        assert answers["one", 2] == (400, {"error": "input 'x': batch size 2 exceeds the model's max_batch_size 1"})
        # an .om's sizes were fixed when it was compiled: its max_batch_size is not honoured, in a WARNING
        warned = [(r.levelname, r.getMessage()) for r in caplog.records if "is above the largest" in r.getMessage()]
        assert sorted(warned) == [
            ("WARNING", "om:1: max_batch_size 16 is above the largest compiled batch size 4: a batch holds 4 rows at "
                        "most, and a request of more is refused (an .om's batch sizes were fixed when it was "
                        "compiled: ATC's --dynamic_batch_size)"),
            ("WARNING", f"past:1: max_batch_size {1 << 30} is above the largest compiled batch size 2048: a batch "
                        "holds 2048 rows at most, and a request of more is refused (an .onnx is compiled with batch "
                        "sizes up to 2048, the largest ATC documents for --dynamic_batch_size)")]
        assert "compile is ignored" not in caplog.text  # (a config.pbtxt sets no compile)
        # a model without a batch dimension: refused naming the pbtxt's field, as for an .om
        assert (index["static"]["state"], index["static"]["reason"]) == (
            State.UNAVAILABLE.value, "config.pbtxt: max_batch_size 4 cannot apply: the model has no batch dimension "
            "(no input has a dynamic first dimension, so it compiles without batch sizes); set 0 or remove it (Triton "
            "refuses a max_batch_size over 0 for such a model too)")
    finally:
        await runner.cleanup()


def test_the_preferred_sizes_of_an_om_are_said_passed_over(tmp_path, model_files):
    """An .om's sizes were fixed by ATC: the preferred sizes a config.pbtxt compiles into an .onnx's
    are passed over for it, said at the scan (they were dropped in silence); an .onnx's are not."""
    pbtxt = "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 6, 3 ] }\n"
    triton_folder(tmp_path, "om", pbtxt, model_files[1]["om"], "model.om")
    triton_folder(tmp_path, "onnx", pbtxt, model_files[1]["onnx"])
    result = scan(tmp_path, ModelConfig())
    assert [note for note in result.notes if "preferred_batch_size" in note] == [
        "om/config.pbtxt: dynamic_batching.preferred_batch_size [3, 6] passed over for om/1/model.om: an .om's batch "
        "sizes were fixed by ATC; batches form at them, which /config lists as preferred_batch_size"], result.notes


@pytest.fixture
def small_device(monkeypatch):
    """A CPU device of 20,000 bytes, read as the runtime starts (ask for it before the runtime)."""
    monkeypatch.setenv("ACLSERVE_CPU_DEVICE_MEMORY", "20000")


@pytest.mark.asyncio
async def test_a_load_refused_for_memory_names_the_max_batch_size_that_set_the_sizes(small_device, make_repo,
                                                                                      models_dir, model_files):
    """Triton allocates per request, so its configs often say a large max_batch_size; here it sets
    the largest batch size compiled, whose buffers are taken at load: a refusal for memory names it
    (x [N, 4] FP32 at 2048 rows is 32 KiB a buffer, over a device of 20,000 bytes). compile.batch a
    model's config.yaml gives is that file's: the refusal keeps its own remedy."""
    triton_folder(models_dir, "huge", "max_batch_size: 2048\n", model_files[1]["onnx"])
    place(model_files[1]["onnx"], models_dir / "yaml.onnx")
    write_in(models_dir / "yaml.yaml", "compile: {batch: [1, 2048]}\n")
    repo, _ = await make_repo(model_control_mode="none")
    reasons = {row["name"]: row.get("reason", "") for row in repo.index()}
    # (more than the device's whole memory: no unload makes room, a smaller size or more memory does)
    remedy = ("more than the device's whole memory (20,000 bytes): raise ACLSERVE_CPU_DEVICE_MEMORY (the CPU "
              "runtime's device memory), or make it smaller (a smaller model or largest batch size)")
    assert reasons["huge"].endswith(f"{remedy}, or lower config.pbtxt's max_batch_size 2048 (it sets the "
                                    "largest batch size compiled)"), reasons
    assert reasons["yaml"].endswith(remedy), reasons
