"""A config.pbtxt's input and output lists compared with the model when it loads
(repository/declared.py), as Triton compares them: a name the model has not, another data_type,
dims (or a reshape) the model's shape does not take fail the load with one line naming the field
(they loaded READY and every request was then refused 400: a tester's repository); dims and a
reshape that fit serve, the requests in the config's dims (max_batch_size 0: the batch dimension
first, as Triton means it). Real CPU OMs (y = x * scale, x and y FP32 [N, 4])."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.repository import State
from aclserve.repository.declared import Reshape

from tests.tiny_models import affine_onnx, compile_cpu_om, conv_onnx, save_graph

from .repo_helpers import place, serving, started_on_old_files, write_in

TENSORS = ('max_batch_size: 4\ninput [ {{ name: "{x}" data_type: {x_type} dims: {x_dims} }} ]\n'
           'output [ {{ name: "{y}" data_type: TYPE_FP32 dims: {y_dims} }} ]\n')


def pbtxt(x="x", x_type="TYPE_FP32", x_dims="[ 4 ]", y="y", y_dims="[ 4 ]") -> str:
    return TENSORS.format(x=x, x_type=x_type, x_dims=x_dims, y=y, y_dims=y_dims)


REFUSED = {
    "dims": (pbtxt(x_dims="[ 32 ]"), "config.pbtxt: input 'x' dims [32] does not match the model's x, [4] per batch "
                                     "row (-1 in the model's takes any size; Triton refuses it too)"),
    "data_type": (pbtxt(x_type="TYPE_FP16"), "config.pbtxt: input 'x' data_type TYPE_FP16 is not the model's "
                                             "TYPE_FP32 (Triton refuses it too)"),
    "input_name": (pbtxt(x="INPUT__0"), "config.pbtxt: input 'INPUT__0': the model has no such input (its inputs: x; "
                                        "Triton refuses it too)"),
    "output_name": (pbtxt(y="OUTPUT__0"), "config.pbtxt: output 'OUTPUT__0': the model has no such output (its "
                                          "outputs: y; Triton refuses it too)"),
    "reshape": (pbtxt(y_dims="[ 2, 3 ] reshape: { shape: [ 6 ] }"),
                "config.pbtxt: output 'y' reshape [6] (dims [2, 3]) does not match the model's y, [4] per batch row "
                "(-1 in the model's takes any size; Triton refuses it too)"),
    # max_batch_size 0: Triton's dims hold the batch dimension (the rule said: they differ by it alone)
    "whole": (pbtxt(x_dims="[ 4 ]").replace("max_batch_size: 4", "max_batch_size: 0"),
              "config.pbtxt: input 'x' dims [4] does not match the model's x, [-1, 4] (-1 in the model's takes any "
              "size; Triton refuses it too); max_batch_size 0: dims give the whole shape, the batch dimension too: "
              "write [-1, 4], or set max_batch_size"),
    # max_batch_size > 0: they leave it out (a tester's commonest mistake moving a repository, t99)
    "with_batch": (pbtxt(x_dims="[ -1, 4 ]"),
                   "config.pbtxt: input 'x' dims [-1, 4] does not match the model's x, [4] per batch row (-1 in the "
                   "model's takes any size; Triton refuses it too); max_batch_size > 0: dims leave the batch "
                   "dimension out: write [4]"),
}


@pytest.mark.asyncio
async def test_what_the_model_does_not_match_fails_its_load_naming_the_field(make_repo, models_dir, model_files):
    for name, (text, _) in REFUSED.items():
        place(model_files[1]["om"], models_dir / name / "1" / "model.om")
        write_in(models_dir / name / "config.pbtxt", text)
    place(model_files[2]["om"], models_dir / "fits" / "1" / "model.om")  # -1 in the model's takes 4
    write_in(models_dir / "fits" / "config.pbtxt", pbtxt(x_dims="[ 4 ]", y_dims="[ 2, 2 ] reshape: { shape: [ 4 ] }"))
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["fits"]
    index = {r["name"]: (r["state"], r["reason"]) for r in repo.index()}
    for name, (_, reason) in REFUSED.items():
        assert index[name] == (State.UNAVAILABLE.value, reason), name


@pytest.mark.asyncio
async def test_reshapes_that_fit_serve_in_the_configs_dims(make_repo, models_dir, model_files):
    """The client's tensors (the codec checks them against `inputs`) become the model's as views;
    its outputs are answered in the config's dims. With max_batch_size 0 both begin with the batch
    dimension, served as rows as the model's is."""
    place(model_files[2]["om"], models_dir / "m" / "1" / "model.om")
    write_in(models_dir / "m" / "config.pbtxt",
             pbtxt(x_dims="[ 2, 2 ] reshape: { shape: [ 4 ] }", y_dims="[ 1, 4 ] reshape: { shape: [ 4 ] }"))
    place(model_files[3]["om"], models_dir / "whole" / "1" / "model.om")
    write_in(models_dir / "whole" / "config.pbtxt", pbtxt(x_dims="[ -1, 2, 2 ] reshape: { shape: [ -1, 4 ] }",
                                                          y_dims="[ -1, 4 ]").replace("max_batch_size: 4",
                                                                                      "max_batch_size: 0"))
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["m", "whole"]
    m, whole = repo.get("m"), repo.get("whole")
    assert [(s.shape, s.reshape) for s in [*m.inputs, *m.outputs]] == [((-1, 2, 2), (4,)), ((-1, 1, 4), (4,))]
    assert [(s.shape, s.reshape) for s in [*whole.inputs, *whole.outputs]] == [((-1, 2, 2), (4,)), ((-1, 4), None)]
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    y = (await m.infer({"x": x}, 3)).outputs["y"]
    assert y.shape == (3, 1, 4) and y.tolist() == (2 * x).reshape(3, 1, 4).tolist()
    y = (await whole.infer({"x": x}, 3)).outputs["y"]
    assert y.shape == (3, 4) and y.tolist() == (3 * x).reshape(3, 4).tolist()


def test_a_reshape_is_a_view_mapping_variable_dimensions_in_order():
    """Triton's mapping: the target's -1 dimensions take the sizes of the source's, in order."""
    source = np.arange(5 * 2 * 7 * 3, dtype=np.float32).reshape(5, 2, 7, 3)
    shaped = Reshape((2, -1, 3), (-1, 6), rows=True)(source)
    assert shaped.shape == (5, 7, 6) and np.shares_memory(shaped, source)
    assert Reshape((1,), (), rows=True)(np.zeros((3, 1))).shape == (3,)  # Triton's scalar: dims [1], reshape []
    assert Reshape((2, 5), (10,), rows=False)(np.zeros((2, 5))).shape == (10,)  # a static model's whole tensor


def _static_onnx(path) -> str:
    """y = x * 2, FP32 [1, 12] -> [1, 12]: no batch dimension."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12])
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "d", [x], [y], [two]), path)


STATIC_REFUSED = {
    "static_dims": ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 7 ] } ]',
                    "config.pbtxt: input 'x' dims [7] does not match the model's x, [1, 12] (-1 in the model's takes "
                    "any size; Triton refuses it too)"),
}


@pytest.mark.asyncio
async def test_a_static_model_under_max_batch_size_0_is_compared_whole_with_one_list_given(
        make_repo, models_dir, tmp_path):
    """Triton's backend completes no max_batch_size for a model without a batch dimension: its
    dims are the whole shape, given one list or both (one list: they were passed over, a [12]
    request refused and dims [7] READY)."""
    om = compile_cpu_om(_static_onnx(tmp_path / "static.onnx"), tmp_path / "static.om", batch=None)
    for name, tensors in {"static": 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 12 ] reshape: { shape: '
                                    '[ 1, 12 ] } } ]', "static_dims": STATIC_REFUSED["static_dims"][0]}.items():
        place(om, models_dir / name / "1" / "model.om")
        write_in(models_dir / name / "config.pbtxt", f"max_batch_size: 0\n{tensors}\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["static"]
    index = {r["name"]: (r["state"], r["reason"]) for r in repo.index()}
    assert index["static_dims"] == (State.UNAVAILABLE.value, STATIC_REFUSED["static_dims"][1])
    static = repo.get("static")
    assert [(s.shape, s.reshape) for s in static.inputs] == [((12,), (1, 12))]
    y = (await static.infer({"x": np.arange(12, dtype=np.float32)}, 1)).outputs["y"]
    assert y.tolist() == [[2.0 * i for i in range(12)]]


@pytest.mark.asyncio
async def test_what_triton_refuses_of_the_lists_against_the_model_fails_its_load(
        make_repo, models_dir, model_files, tmp_path):
    """A fixed first dimension with max_batch_size 0 (Triton takes only that many rows: it was
    served any number), fewer inputs listed than the model has, an empty reshape of a model
    without a batch dimension: each fails its load naming why."""
    place(model_files[1]["om"], models_dir / "fixed_rows" / "1" / "model.om")
    write_in(models_dir / "fixed_rows" / "config.pbtxt", pbtxt(x_dims="[ 4, 4 ]", y_dims="[ -1, 4 ]").replace(
        "max_batch_size: 4", "max_batch_size: 0"))
    place(compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", batch="1,2"),
          models_dir / "one_of_two" / "1" / "model.om")
    write_in(models_dir / "one_of_two" / "config.pbtxt", 'max_batch_size: 2\ninput [ { name: "x" data_type: '
                                                         'TYPE_FP32 dims: [ 8 ] } ]\n')
    place(compile_cpu_om(_static_onnx(tmp_path / "static.onnx"), tmp_path / "static.om", batch=None),
          models_dir / "static_empty" / "1" / "model.om")
    write_in(models_dir / "static_empty" / "config.pbtxt", 'max_batch_size: 0\ninput [ { name: "x" data_type: '
                                                           'TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]\n')
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == []
    index = {r["name"]: r["reason"] for r in repo.index()}
    assert index["fixed_rows"] == ("config.pbtxt: input 'x' dims [4, 4]: with max_batch_size 0 the first dimension "
                                   "is the model's batch dimension, served as any number of rows: give -1 there (dims "
                                   "[-1, 4]), or max_batch_size over 0 and dims [4]")
    assert index["one_of_two"] == ("config.pbtxt: input lists 1 inputs (optional ones left out), the model has 2 "
                                   "(not listed: idx); list them all or none (Triton refuses it too: configuration "
                                   "expects 1 inputs, model provides 2)")
    assert index["static_empty"] == ("config.pbtxt: input 'x' reshape: cannot be empty with max_batch_size 0 on a "
                                     "model without a batch dimension: the tensor would hold no data (Triton refuses "
                                     "it too)")


@pytest.mark.asyncio
async def test_a_request_handed_to_a_successor_is_answered_in_the_configs_dims(make_repo, models_dir, model_files):
    """A request held by a version replaced meanwhile runs on its successor (the same tensors):
    its reshapes still apply both ways."""
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    write_in(models_dir / "m" / "config.pbtxt",
             pbtxt(x_dims="[ 2, 2 ] reshape: { shape: [ 4 ] }", y_dims="[ 1, 4 ] reshape: { shape: [ 4 ] }"))
    repo, events = await make_repo()
    held = repo.get("m")
    place(model_files[2]["om"], models_dir / "m" / "1" / "model.om")
    await events.wait("reloaded", "m", "1")
    await repo.wait_idle()  # the held version has drained and closed
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    y = (await held.infer({"x": x}, 3)).outputs["y"]
    assert y.shape == (3, 1, 4) and y.tolist() == (2 * x).reshape(3, 1, 4).tolist()


@pytest.mark.asyncio
async def test_an_image_format_takes_three_dims_as_triton_requires(models_dir, model_files, tmp_path):
    """Triton's ValidateModelInput refuses FORMAT_NCHW or FORMAT_NHWC on an input whose dims have
    not 3 entries (it was passed over, the model served); on a picture's 3 it is passed over."""
    place(model_files[1]["om"], models_dir / "flat" / "1" / "model.om")
    write_in(models_dir / "flat" / "config.pbtxt", pbtxt(x_dims="[ 4 ] format: FORMAT_NCHW"))
    place(compile_cpu_om(conv_onnx(tmp_path / "conv.onnx"), tmp_path / "conv.om"), models_dir / "picture" / "1" /
          "model.om")
    write_in(models_dir / "picture" / "config.pbtxt", 'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 '
                                                      'format: FORMAT_NCHW dims: [ 3, 16, 16 ] } ]\n')
    runner, _, _, _, repo = await started_on_old_files(models_dir)
    try:
        assert serving(repo) == ["picture"]
        (reason,) = [r["reason"] for r in repo.index() if r["name"] == "flat"]
        assert reason.endswith("/flat/config.pbtxt: input[0].format: FORMAT_NCHW takes dims of 3 entries (a "
                               "picture's), not [4] (Triton refuses it too)"), reason
    finally:
        await runner.cleanup()


def _plus_b_onnx(path, b_is_input: bool) -> str:
    """y = a + b, FP32 [N, 4] -> [N, 4]; b an input [N, 4], or an initializer [1, 4] (Triton's ONNX
    Runtime backend lets requests override one listed `optional`)."""
    vi = helper.make_tensor_value_info
    inputs = [vi("a", TensorProto.FLOAT, ["N", 4])] + ([vi("b", TensorProto.FLOAT, ["N", 4])] if b_is_input else [])
    inits = [] if b_is_input else [numpy_helper.from_array(np.ones((1, 4), np.float32), "b")]
    return save_graph(helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "plus_b", inputs,
                                        [vi("y", TensorProto.FLOAT, ["N", 4])], inits), path)


OPTIONAL_B = ('max_batch_size: 0\ninput [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 4 ] },\n'
              '{ name: "b" data_type: TYPE_FP32 dims: [ -1, 4 ] optional: true } ]\n'
              'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n')


@pytest.mark.asyncio
async def test_an_input_marked_optional_is_refused_saying_what_optional_means_here(make_repo, models_dir, tmp_path):
    """A tester's Triton repository: `optional` marks an initializer requests may override, which
    the compile makes a constant (it was refused as "Triton refuses it too", which Triton does
    not); marked on an input of the model, both listed, it was refused as if one were left out."""
    for name, b_is_input in (("initializer", False), ("input", True)):
        onnx_path = _plus_b_onnx(tmp_path / f"{name}.onnx", b_is_input)
        place(compile_cpu_om(onnx_path, tmp_path / f"{name}.om", batch="1,2"), models_dir / name / "1" / "model.om")
        write_in(models_dir / name / "config.pbtxt", OPTIONAL_B)
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == []
    index = {r["name"]: r["reason"] for r in repo.index()}
    assert index["initializer"] == ("config.pbtxt: input 'b' (optional): not an input of the model (its inputs: a); "
                                    "an optional input is an initializer requests may override, and the compile to "
                                    "an OM makes initializers constants: remove it from input (it can no longer be "
                                    "overridden)")
    assert index["input"] == ("config.pbtxt: input 'b' marked optional is an input of the model, and optional means "
                              "an initializer requests may override: remove its optional: true (Triton refuses it "
                              "too, counting it out: configuration expects 1 inputs, model provides 2)")
