"""A config.pbtxt's input dims size the dimensions an .onnx leaves variable (om/declared_dims.py),
as its max_batch_size sets the batch sizes: a model of [N, L] under max_batch_size 8 and dims
[ 5 ] failed to load ("dim 1 is dynamic (L); fix it with compile.input_shape", which a config.pbtxt
cannot give; found by a tester migrating a Triton repository). A reshape, the shape the model
takes, sizes them where given; -1 there, or the input not listed, fails the load in the pbtxt's
words, every such input at once (a transformer's input_ids and attention_mask were said one at a
time: a tester, t96). An output the compile so sized takes -1 in its dims, as Triton compares the
.onnx's own. The real server, the CPU runtime, onnx.helper models."""
from __future__ import annotations

import aiohttp
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.repository import State
from tests.tiny_models import save_graph

from .repo_helpers import started_on_old_files, write_in


def double_onnx(path, shape) -> str:
    """y = 2 * x, FP32 of `shape` (its symbols variable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "d", [x], [y], [two]), path)


def tensors(x_dims: str, y_dims: str = "[ -1 ]") -> str:
    return (f'input [ {{ name: "x" data_type: TYPE_FP32 dims: {x_dims} }} ]\n'
            f'output [ {{ name: "y" data_type: TYPE_FP32 dims: {y_dims} }} ]\n')


FOLDERS = {  # name: (the model's shape, config.pbtxt)
    "fixed": (["N", "L"], "max_batch_size: 8\n" + tensors("[ 5 ]")),
    "reshaped": (["N", 2, "L"], "max_batch_size: 8\n" + tensors("[ 10 ] reshape: { shape: [ 2, 5 ] }",
                                                                 "[ 2, -1 ]")),
    "whole": (["N", "L"], "max_batch_size: 0\n" + tensors("[ -1, 5 ]", "[ -1, 5 ]")),
    "variable": (["N", "L"], "max_batch_size: 8\n" + tensors("[ -1 ]")),
    "unlisted": (["N", "L"], "max_batch_size: 8\n"),
    "unlisted_two": (["N", "H", "W"], "max_batch_size: 8\n"),  # (both said, as the compile says them)
    # dims of the model's whole rank (the batch dimension given too) size nothing (a tester, t99: L was
    # fixed from their 5 and the refusal quoted [5] as the model's)
    "full_rank": (["N", "L"], "max_batch_size: 4\n" + tensors("[ 3, 5 ]")),
    "one_short": (["N", "L"], "max_batch_size: 0\n" + tensors("[ 5 ]", "[ -1, -1 ]")),
}


MISSHAPEN = {  # the .onnx's own shape quoted (-1: L, variable), with the rule and what to write
    "full_rank": "config.pbtxt: input 'x' dims [3, 5] does not match the model's x, [-1] per batch row (-1 in the "
                 "model's takes any size; Triton refuses it too); max_batch_size > 0: dims leave the batch dimension "
                 "out: write [5]",
    "one_short": "config.pbtxt: input 'x' dims [5] does not match the model's x, [-1, -1] (-1 in the model's takes "
                 "any size; Triton refuses it too); max_batch_size 0: dims give the whole shape, the batch dimension "
                 "too: write [-1, 5], or set max_batch_size",
}


@pytest.mark.asyncio
async def test_the_pbtxt_dims_size_what_the_onnx_leaves_variable(models_dir):
    for name, (shape, pbtxt) in FOLDERS.items():
        double_onnx(models_dir / name / "1" / "model.onnx", shape)
        write_in(models_dir / name / "config.pbtxt", pbtxt)
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        rows = np.arange(10, dtype=np.float32).reshape(2, 5)
        async with aiohttp.ClientSession() as session:
            answers = {}
            for name, sent in (("fixed", rows), ("fixed", np.zeros((2, 6), np.float32)), ("whole", rows),
                               ("reshaped", np.arange(20, dtype=np.float32).reshape(2, 10))):
                request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(sent.shape),
                                       "data": sent.ravel().tolist()}]}
                async with session.post(f"{base}/v2/models/{name}/infer", json=request) as resp:
                    answers[name, sent.shape[1]] = (resp.status, await resp.json())
            async with session.get(f"{base}/v2/models/fixed/config") as resp:
                shown = await resp.json()
            async with session.get(f"{base}/v2/models/reshaped") as resp:
                metadata = await resp.json()
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {r["name"]: (r["state"], r.get("reason", "")) for r in await resp.json() if not r["version"]
                         or r["state"] != State.READY.value}
        status, body = answers["fixed", 5]
        assert status == 200 and body["outputs"][0]["shape"] == [2, 5]
        assert body["outputs"][0]["data"] == (2 * rows).ravel().tolist()
        assert answers["fixed", 6][0] == 400  # the length its dims fix
        assert (shown["input"][0]["dims"], shown["output"][0]["dims"], shown["max_batch_size"]) == ([5], [-1], 8)
        status, body = answers["reshaped", 10]  # ten values a row, the model's [2, 5]
        assert status == 200 and body["outputs"][0]["shape"] == [2, 2, 5], body
        assert body["outputs"][0]["data"] == [2.0 * i for i in range(20)]
        assert metadata["inputs"][0]["shape"] == [-1, 10]
        status, body = answers["whole", 5]
        assert status == 200 and body["outputs"][0]["data"] == (2 * rows).ravel().tolist()
        assert sorted(index) == ["full_rank", "one_short", "unlisted", "unlisted_two", "variable"], index
        for name, reason in MISSHAPEN.items():
            assert index[name] == (State.UNAVAILABLE.value, reason), name
        assert index["variable"] == (State.UNAVAILABLE.value, "config.pbtxt: input 'x' dims [-1] give no fixed length "
                                     "to dimension 1 of the model's x (L), which aclserve cannot serve variable: an "
                                     ".onnx is compiled for fixed sizes, only the batch dimension may vary; give its "
                                     "length in dims (e.g. dims: [ 16 ])")
        assert index["unlisted"] == (State.UNAVAILABLE.value, "config.pbtxt: input 'x' is not listed, so nothing "
                                     "fixes dimension 1 of the model's x (L), which aclserve cannot serve variable: "
                                     "an .onnx is compiled for fixed sizes, only the batch dimension may vary; list "
                                     "it in input with its length there in dims (every input of the model, as Triton "
                                     "counts them)")
        assert index["unlisted_two"] == (State.UNAVAILABLE.value, "config.pbtxt: input 'x' is not listed, so "
                                         "nothing fixes dimensions 1 and 2 of the model's x (H, W), which aclserve "
                                         "cannot serve variable: an .onnx is compiled for fixed sizes, only the batch "
                                         "dimension may vary; list it in input with its lengths there in dims (every "
                                         "input of the model, as Triton counts them)")
        assert repo.get("fixed").gears == (1, 2, 4, 8)
    finally:
        await runner.cleanup()


def masked_ids_onnx(path) -> str:
    """y = input_ids * attention_mask, INT64 [batch, seq] each: a transformer's two inputs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids, mask, y = (helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
                    for name in ("input_ids", "attention_mask", "y"))
    return save_graph(helper.make_graph([helper.make_node("Mul", ["input_ids", "attention_mask"], ["y"])], "t",
                                        [ids, mask], [y]), path)


def ids_tensors(dims: str) -> str:
    """input_ids and attention_mask listed with `dims`, and y."""
    entries = [f'{{ name: "{name}" data_type: TYPE_INT64 dims: {dims} }}' for name in ("input_ids", "attention_mask")]
    return f"input [ {', '.join(entries)} ]\noutput [ {{ name: \"y\" data_type: TYPE_INT64 dims: [ -1 ] }} ]\n"


@pytest.mark.asyncio
async def test_every_input_the_pbtxt_leaves_variable_is_named_at_once_each_with_what_to_write(models_dir):
    """Two inputs, neither fixed: both are said in one reason, each with what to write for it, and
    that they share the model's seq (the compile gives them one size), not the first alone."""
    for name, tensors_listed in (("unlisted", ""), ("variable", ids_tensors("[ -1 ]")),
                                 ("fixed", ids_tensors("[ 4 ]"))):
        pbtxt = "max_batch_size: 8\n" + tensors_listed
        masked_ids_onnx(models_dir / name / "1" / "model.onnx")
        write_in(models_dir / name / "config.pbtxt", pbtxt)
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {r["name"]: (r["state"], r.get("reason", "")) for r in await resp.json() if r["version"]}
        why = ("which aclserve cannot serve variable: an .onnx is compiled for fixed sizes, only the batch dimension "
               "may vary")
        assert index["unlisted"] == (State.UNAVAILABLE.value, (
            f"config.pbtxt: 2 inputs keep dimensions the model leaves variable, {why}: input 'input_ids' is not "
            "listed, so nothing fixes dimension 1 of the model's input_ids (seq): list it in input with its length "
            "there in dims (every input of the model, as Triton counts them); input 'attention_mask' is not listed, "
            "so nothing fixes dimension 1 of the model's attention_mask (seq): list it in input with its length "
            "there in dims; input_ids and attention_mask share seq: give them one length"))
        assert index["variable"] == (State.UNAVAILABLE.value, (
            f"config.pbtxt: 2 inputs keep dimensions the model leaves variable, {why}: input 'input_ids' dims [-1] "
            "give no fixed length to dimension 1 of the model's input_ids (seq): give its length in dims (e.g. dims: "
            "[ 16 ]); input 'attention_mask' dims [-1] give no fixed length to dimension 1 of the model's "
            "attention_mask (seq): give its length in dims (e.g. dims: [ 16 ]); input_ids and attention_mask share "
            "seq: give them one length"))
        assert index["fixed"][0] == State.READY.value, index  # (what the reasons say to write serves)
        assert repo.get("fixed").inputs[0].shape[1:] == (4,)
    finally:
        await runner.cleanup()
