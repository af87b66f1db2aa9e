"""A model's settings that cannot apply to the model loaded, or to the host: the load fails with
the reason in the index, or the log names what is passed over (found by an independent check)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from aclserve.repository import State
from aclserve.server.model_info import model_metadata
from tests import REPO
from tests.tiny_models import TOKEN_ROWS, compile_cpu_om, conv_onnx, save_graph, scale_onnx, token_graph

from .repo_helpers import place, serving, write_in

pytestmark = pytest.mark.asyncio


def index_of(repo) -> dict:
    return {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}


async def test_a_device_the_host_has_not_fails_the_load_whatever_the_instances(make_repo, models_dir, model_files,
                                                                                runtime):
    """`devices: [0, 5]` with one instance loaded READY on a host of one device (/config showing
    devices "0,5") and failed only once an instance was placed on device 5."""
    count = runtime.device_count()
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text(f"devices: [0, {count + 3}]\ninstances: 1\n")
    place(model_files[1]["om"], models_dir / "fits.om")
    (models_dir / "fits.yaml").write_text(f"devices: {list(range(count))}\ninstances: 1\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["fits"]
    state, reason = index_of(repo)[("m", "1")]
    assert state == State.UNAVAILABLE and reason.startswith(
        f"{models_dir / 'm.yaml'}: devices [0, {count + 3}]: this host has no device {count + 3} ")


@pytest.fixture(scope="module")
def static_om(tmp_path_factory):
    """y = x * 2 compiled without batch sizes: x [1, 4], one request per run."""
    folder = tmp_path_factory.mktemp("static")
    return compile_cpu_om(scale_onnx(folder / "s.onnx", 2.0), folder / "s.om", batch="1")


async def test_batching_a_static_model_cannot_take_fails_its_own_config_and_is_named_from_model_defaults(
        make_repo, models_dir, static_om, caplog):
    """`batching: {max_batch_size: 8, max_queue_delay_ms: 5}` in a static model's config.yaml, and
    `max_batch_size: 4` with `dynamic_batching { }` in its config.pbtxt, loaded READY without a
    word (an independent check): the model's own max_batch_size fails the load, as Triton refuses
    it for a model without a batch dimension; model_defaults' never fails a model, and what does
    not apply is named in an INFO line."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.served")
    place(static_om, models_dir / "own.om")
    (models_dir / "own.yaml").write_text("batching: {max_batch_size: 8, max_queue_delay_ms: 5}\n")
    place(static_om, models_dir / "triton" / "1" / "model.om")
    (models_dir / "triton" / "config.pbtxt").write_text("max_batch_size: 4\ndynamic_batching { }\n")
    place(static_om, models_dir / "window.om")
    (models_dir / "window.yaml").write_text("batching: {max_queue_delay_ms: 5}\n")
    place(static_om, models_dir / "inherits.om")
    # (make_repo's model_defaults give max_queue_delay_ms 0.5)
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.batching.max_batch_size": 8})
    assert serving(repo) == ["inherits", "window"]
    index = index_of(repo)
    said = ("cannot apply: the model has no batch dimension (compiled without batch sizes, it runs one request at a "
            "time); set 0 or remove it (Triton refuses a max_batch_size over 0 for such a model too)")
    assert index[("own", "1")] == (State.UNAVAILABLE, f"own.yaml: batching.max_batch_size 8 {said}")
    assert index[("triton", "1")] == (State.UNAVAILABLE, f"config.pbtxt: max_batch_size 4 {said}")
    passed = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    tail = "passed over: the model has no batch dimension (compiled without batch sizes, it runs one request at a time)"
    assert sorted(passed) == [
        f"inherits:1: batching max_batch_size 8 (model_defaults', or --max-batch) and max_queue_delay_ms 0.5 {tail}",
        f"window:1: batching max_batch_size 8 (model_defaults', or --max-batch) and max_queue_delay_ms 5 {tail}"]
    assert (await repo.get("window").infer({"x": np.ones((1, 4), np.float32)}, 1)).outputs["y"].tolist() == [[2.0] * 4]


@pytest.fixture(scope="module")
def conv_om(tmp_path_factory):
    """x FP32 [N, 3, 16, 16] (a picture's, NCHW) -> y [N, 4, 16, 16]: 1,024 classes."""
    folder = tmp_path_factory.mktemp("conv")
    return compile_cpu_om(conv_onnx(folder / "conv.onnx"), folder / "conv.om")


@pytest.fixture(scope="module")
def gray_conv_om(tmp_path_factory):
    """x FP32 [N, 1, 16, 16] (a grey picture's) -> y [N, 4, 16, 16]."""
    folder = tmp_path_factory.mktemp("gray_conv")
    return compile_cpu_om(conv_onnx(folder / "gray.onnx", channels=1), folder / "gray.om")


async def test_model_defaults_image_and_labels_pass_over_the_models_they_do_not_fit(
        make_repo, models_dir, model_files, conv_om, tmp_path, caplog):
    """model_defaults' `outputs.y.labels` (a file of 4 lines) and `inputs.x.image` failed every
    model they did not fit (no such tensor, another class count, an input no picture fits), where
    its value_range is passed over (found by a configuration tester): each is passed over for such a
    model, said in an INFO line naming the model and the setting, and taken by those it fits. A
    model's own file giving the same fails that model. An integer input that an image default
    cannot feed keeps the range its compile found (it indexes a table)."""
    caplog.set_level(logging.INFO, logger="aclserve")
    four = tmp_path / "four.txt"
    four.write_text("a\nb\nc\nd\n")
    place(model_files[2]["om"], models_dir / "scale.om")  # x [N, 4], y 4 classes: takes the labels
    place(conv_om, models_dir / "conv.om")  # takes the image settings; its y has 1,024 classes
    save_graph(token_graph(), models_dir / "tok.onnx")  # ids INT32 [N, 3] indexing a table, emb: neither
    place(model_files[2]["om"], models_dir / "own.om")
    (models_dir / "own.yaml").write_text(f"outputs: {{y: {{labels: {four}}}}}\ninputs: {{x: {{image: {{}}}}}}\n")
    place(conv_om, models_dir / "ownlabels.om")
    (models_dir / "ownlabels.yaml").write_text(f"outputs: {{y: {{labels: {four}}}}}\n")
    image = {"image": {"color": "rgb"}}
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.outputs": {"y": {"labels": str(four)}},
                                                            "model_defaults.inputs": {"x": image, "ids": image}})
    assert serving(repo) == ["conv", "scale", "tok"]
    index = index_of(repo)
    assert index[("own", "1")][0] == State.UNAVAILABLE and "[N, H, W, C]" in index[("own", "1")][1]
    assert index[("ownlabels", "1")] == (State.UNAVAILABLE, f"{models_dir / 'ownlabels.yaml'}: outputs.y.labels: "
                                         "labels file four.txt has 4 labels; output 'y' has 1024 classes")
    said = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    shapes = "the model input must be [N, H, W, C], [N, C, H, W] or [N, H, W]; it is"
    for line in ("conv:1: model_defaults' outputs.y.labels passed over: labels file four.txt has 4 labels; output "
                 "'y' has 1024 classes",
                 f"scale:1: model_defaults' inputs.x.image passed over: {shapes} [-1, 4]",
                 f"tok:1: model_defaults' inputs.ids.image passed over: {shapes} [-1, 3]",
                 "tok:1: model_defaults' inputs.x.image passed over: the model has no input 'x' (inputs: ids)",
                 "tok:1: model_defaults' outputs.y.labels passed over: the model has no output 'y' (outputs: emb)"):
        assert line in said
    scale, conv, tok = repo.get("scale"), repo.get("conv"), repo.get("tok")
    assert scale.labels == {"y": ("a", "b", "c", "d")} and scale.images is None
    assert conv.labels == {} and list(conv.images.plans) == ["x"]
    assert [o.get("parameters") for o in model_metadata(conv, ["1"])["outputs"]] == [None]  # no label_filename
    assert model_metadata(scale, ["1"])["outputs"][0]["parameters"] == {"label_filename": "four.txt"}
    assert tok.images is None and [(r.low, r.high) for r in tok.value_ranges.values()] == [(0, TOKEN_ROWS - 1)]


async def test_model_defaults_mean_and_std_a_model_does_not_take_are_passed_over_alone(
        make_repo, models_dir, model_files, conv_om, gray_conv_om, caplog):
    """model_defaults' image settings that a model refused only for their mean/std were passed over
    whole: an OM whose AIPP normalises (uint8 input) or a grey float input beside a 3-value mean
    kept its input a tensor, and clients' JPEGs got 400 (found in review). Now, for a uint8 input
    (normalised by the model's AIPP), only the mean and std are passed over, said in an INFO line:
    the input takes pictures, unnormalised. A float input they do not fit keeps its tensor (its
    pixels unnormalised would be answered wrongly, quietly); a model they fit takes them all, and
    one no picture fits keeps its tensor."""
    caplog.set_level(logging.INFO, logger="aclserve.images")
    place(str(REPO / "models" / "digits_image.om"), models_dir / "aipp.om")  # x UINT8 [N, 8, 8, 1]
    place(gray_conv_om, models_dir / "gray.om")  # x FP32 [N, 1, 16, 16]
    place(conv_om, models_dir / "rgb.om")  # x FP32 [N, 3, 16, 16]
    place(model_files[1]["om"], models_dir / "scale.om")  # x FP32 [N, 4]: no picture
    image = {"resize": "letterbox", "mean": [120.0, 110.0, 100.0], "std": [60.0]}
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.inputs": {"x": {"image": image}}})
    assert serving(repo) == ["aipp", "gray", "rgb", "scale"]
    plans = {name: repo.get(name).images and repo.get(name).images.plans.get("x") for name in serving(repo)}
    assert plans["scale"] is None and plans["gray"] is None
    assert plans["aipp"].resize == "letterbox" and plans["aipp"].mean is None and plans["aipp"].std is None
    assert model_metadata(repo.get("aipp"), ["1"])["inputs"][0]["datatype"] == "BYTES"
    assert model_metadata(repo.get("gray"), ["1"])["inputs"][0]["datatype"] == "FP32"
    assert plans["rgb"].mean.tolist() == [120, 110, 100] and plans["rgb"].std.tolist() == [60] * 3
    said = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    unnormalised = "the input takes its pictures' pixel values, 0-255, as they are"
    assert sorted(said) == [
        "aipp:1: model_defaults' inputs.x.image.mean and std passed over: the model takes uint8 pixels (AIPP "
        f"normalises on the device); {unnormalised}",
        "gray:1: model_defaults' inputs.x.image passed over: mean has 3 values for 1 channel(s)",
        "scale:1: model_defaults' inputs.x.image passed over: the model input must be [N, H, W, C], [N, C, H, W] "
        "or [N, H, W]; it is [-1, 4]"]


async def test_a_setting_the_model_does_not_fit_names_its_key_and_where_it_came_from(
        make_repo, models_dir, model_files, gray_conv_om, tmp_path, caplog):
    """A setting found not to fit when the model loaded said neither its dotted key nor its file
    (`image input 'x': mean has 2 values for 3 channel(s)`), where a parse error names both; and the
    ERROR line of a failed reload said "not loaded" while the previous config served on (found by a
    configuration tester). Now each names the key and its origin: the model's own file, or the
    server config's model_defaults (a model's file making x an image input takes their mean)."""
    caplog.set_level(logging.ERROR, logger="aclserve.repository.failures")
    server_config = tmp_path / "s.yaml"
    server_config.write_text("model_defaults:\n  inputs:\n    x: {image: {mean: [1, 2, 3]}}\n")
    place(gray_conv_om, models_dir / "reloaded.om")  # (served at first without model_defaults' mean)
    repo, events = await make_repo(config_file=str(server_config))
    assert serving(repo) == ["reloaded"]
    write_in(models_dir / "three.txt", "a\nb\nc\n")
    for name, model, config in (("own", gray_conv_om, "inputs: {x: {image: {mean: [1, 2, 3]}}}"),
                                ("takes", gray_conv_om, "inputs: {x: {image: {resize: letterbox}}}"),
                                ("ranged", model_files[1]["om"], "inputs: {nosuch: {value_range: [0, 3]}}"),
                                ("labelled", model_files[1]["om"], "outputs: {y: {labels: three.txt}}"),
                                ("reloaded", None, "inputs: {x: {image: {mean: [4, 5, 6]}}}")):
        write_in(models_dir / f"{name}.yaml", config + "\n")
        if model is not None:
            place(model, models_dir / f"{name}.om")
    for name in ("own", "takes", "ranged", "labelled", "reloaded"):
        await events.wait("load_failed", name)
    said = f"{models_dir / 'reloaded.yaml'}: inputs.x.image.mean: has 3 values for 1 channel(s)"
    assert index_of(repo) == {
        ("own", "1"): (State.UNAVAILABLE, f"{models_dir / 'own.yaml'}: inputs.x.image.mean: has 3 values for 1 "
                                          "channel(s)"),
        ("takes", "1"): (State.UNAVAILABLE, f"the server config's model_defaults ({server_config}): "
                                            "inputs.x.image.mean: has 3 values for 1 channel(s)"),
        ("ranged", "1"): (State.UNAVAILABLE, f"{models_dir / 'ranged.yaml'}: inputs.nosuch.value_range: the model "
                                             "has no input 'nosuch' (inputs: x)"),
        ("labelled", "1"): (State.UNAVAILABLE, f"{models_dir / 'labelled.yaml'}: outputs.y.labels: labels file "
                                               "three.txt has 3 labels; output 'y' has 4 classes"),
        ("reloaded", "1"): (State.READY, f"serving the previous config; the new one failed: {said}")}
    assert (f"reloaded: version 1 from {models_dir / 'reloaded.om'} not loaded (serving the previous config): {said}"
            in [r.getMessage() for r in caplog.records])
