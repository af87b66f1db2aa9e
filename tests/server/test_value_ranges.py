"""An integer input's values outside what the model takes are the client's mistake, answered 400
before the device sees them. A token id past its embedding table was a device fault (500, the
instance rebuilt each time; on CANN's AI Core kernels zeros, a wrong answer): the compile of a
dropped .onnx now finds the inputs that index a table, and a model's YAML can give any integer
input a `value_range`."""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import TOKEN_ROWS as ROWS, compile_cpu_om, save_graph, token_graph

from .hostile import metric


def counts_graph():
    """n INT64 [N, 2] + 1 (no table: only a configured value_range bounds it), x FP32 [N, 2] * 2."""
    nodes = [helper.make_node("Add", ["n", "one"], ["m"]), helper.make_node("Mul", ["x", "two"], ["y"])]
    return helper.make_graph(nodes, "counts", [helper.make_tensor_value_info("n", TensorProto.INT64, ["N", 2]),
                                               helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                             [helper.make_tensor_value_info("m", TensorProto.INT64, ["N", 2]),
                              helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                             [numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
                              numpy_helper.from_array(np.array(2, dtype=np.float32), "two")])


def lut_graph(entries: int = 256):
    """x UINT8 [N, 4, 4, 1], cast and looked up in a table of `entries` (256: a pixel's curve)."""
    nodes = [helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.INT64),
             helper.make_node("Gather", ["lut", "wide"], ["y"], axis=0)]
    return helper.make_graph(nodes, "lut", [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 4, 4, 1])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 1])],
                             [numpy_helper.from_array(np.linspace(0, 1, entries, dtype=np.float32), "lut")])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """tokens.onnx dropped into the folder (compiled there), counts.om compiled elsewhere with a
    value_range in its YAML, lut.onnx an image input, bytes.onnx a UINT8 input indexing a table
    of 1,000; both protocols."""
    src, models = tmp_path_factory.mktemp("ranges_src"), tmp_path_factory.mktemp("ranges_models")
    save_graph(token_graph(), models / "tokens.onnx")
    compile_cpu_om(save_graph(counts_graph(), src / "counts.onnx"), models / "counts.om")
    (models / "counts.yaml").write_text("inputs:\n  n: {value_range: [-5, 9]}\n")
    save_graph(lut_graph(), models / "lut.onnx")
    (models / "lut.yaml").write_text("inputs:\n  x: {image: {color: gray}}\n")
    save_graph(lut_graph(1000), models / "bytes.onnx")  # a UINT8 input indexing a table of 1,000
    config = server_config(models, model_control_mode="none", grpc_port=free_port())
    with ServerThread(config) as srv:
        srv.grpc_url = f"127.0.0.1:{config.grpc_port}"
        srv.source = os.fspath(models / "tokens.onnx")
        yield srv


def post(srv, model: str, inputs: list) -> tuple[int, dict]:
    status, _, body = request(srv, "POST", f"/v2/models/{model}/infer", data=json.dumps({"inputs": inputs}).encode())
    return status, json.loads(body)


def ids_input(values):
    return {"name": "ids", "datatype": "INT32", "shape": [len(values) // 3, 3], "data": values}


def test_a_token_past_the_table_is_a_400_naming_the_value_and_the_table(served):
    before = metric(served.url, "aclserve_instance_rebuilds_total", 'model="tokens",version="1"')
    for bad in (ROWS, -1, 2**31 - 1):
        status, body = post(served, "tokens", [ids_input([0, 1, bad])])
        assert status == 400, body
        assert body["error"] == (f"input 'ids': value {bad} is outside 0..{ROWS - 1}, the values the model takes "
                                 "(it indexes a table of the model)")
    ids = np.array([[0, 7, ROWS - 1], [3, 3, 3]], dtype=np.int32)
    status, body = post(served, "tokens", [ids_input(ids.ravel().tolist())])
    assert status == 200, body
    expected = ort.InferenceSession(served.source).run(None, {"ids": ids})[0]
    assert np.array_equal(np.array(body["outputs"][0]["data"], dtype=np.float32).reshape(2, 3, 2), expected)
    # refused before the device: no batch failed, no instance was rebuilt
    assert metric(served.url, "aclserve_instance_rebuilds_total", 'model="tokens",version="1"') == before


def test_the_models_metadata_gives_each_range(served):
    """A client can read what it may send: the input's `value_range` parameter (HTTP; gRPC's
    TensorMetadata has no parameters)."""
    # (bytes: capped to what UINT8 holds; it advertised 0..999, values no request can carry)
    for model, name, wanted in (("tokens", "ids", [0, ROWS - 1]), ("counts", "n", [-5, 9]), ("bytes", "x", [0, 255])):
        status, _, body = request(served, "GET", f"/v2/models/{model}")
        inputs = {i["name"]: i for i in json.loads(body)["inputs"]}
        assert status == 200 and inputs[name]["parameters"] == {"value_range": wanted}
    status, _, body = request(served, "GET", "/v2/models/counts")
    assert "parameters" not in {i["name"]: i for i in json.loads(body)["inputs"]}["x"]


def test_a_raw_binary_request_is_checked_too(served):
    """Inference-Header-Content-Length: 0, the body the one input's bytes (a review found it unchecked)."""
    status, _, body = request(served, "POST", "/v2/models/tokens/infer",
                              data=np.array([[1, 2, ROWS]], dtype=np.int32).tobytes(),
                              headers={"Inference-Header-Content-Length": "0"})
    assert status == 400 and json.loads(body)["error"].startswith(f"input 'ids': value {ROWS} is outside 0..{ROWS - 1}")


def test_an_image_input_indexing_a_table_takes_pictures(served):
    """Its compile finds the table, but the input takes encoded pictures the server decodes: no
    range (the encoded bytes reached the check: 500 for every request, a review's finding)."""
    from tests.images.images_data import encode
    picture = base64.b64encode(encode(np.full((4, 4), 255, np.uint8))).decode()
    status, body = post(served, "lut", [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [picture]}])
    assert status == 200, body
    assert body["outputs"][0]["data"] == [1.0] * 16


def test_binary_and_grpc_requests_are_checked_alike(served):
    ids = np.array([[1, 2, ROWS + 7]], dtype=np.int32)
    message = f"input 'ids': value {ROWS + 7} is outside 0..{ROWS - 1}"
    with httpclient.InferenceServerClient(served.url) as client:
        tensor = httpclient.InferInput("ids", [1, 3], "INT32")
        tensor.set_data_from_numpy(ids, binary_data=True)
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.infer("tokens", [tensor])
        assert refused.value.status() == "400"
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        tensor = grpcclient.InferInput("ids", [1, 3], "INT32")
        tensor.set_data_from_numpy(ids)
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.infer("tokens", [tensor])
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_configured_range_bounds_an_om_compiled_elsewhere(served):
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    status, body = post(served, "counts", [{"name": "n", "datatype": "INT64", "shape": [1, 2], "data": [-5, 10]}, x])
    assert status == 400
    assert body["error"] == "input 'n': value 10 is outside -5..9, the values the model takes (the model's value_range)"
    status, body = post(served, "counts", [{"name": "n", "datatype": "INT64", "shape": [1, 2], "data": [-5, 9]}, x])
    assert status == 200 and body["outputs"][0]["data"] == [-4, 10]


def test_a_range_the_model_cannot_take_fails_the_load_naming_it(tmp_path):
    src, models = tmp_path / "src", tmp_path / "models"
    src.mkdir()
    models.mkdir()
    compile_cpu_om(save_graph(counts_graph(), src / "counts.onnx"), models / "counts.om")
    compile_cpu_om(save_graph(counts_graph(), src / "other.onnx"), models / "other.om")
    (models / "counts.yaml").write_text("inputs:\n  x: {value_range: [0, 1]}\n")
    (models / "other.yaml").write_text("inputs:\n  z: {value_range: [0, 1]}\n")
    compile_cpu_om(save_graph(counts_graph(), src / "none.onnx"), models / "none.om")
    (models / "none.yaml").write_text("inputs:\n  n: {value_range: [-9300000000000000000, -9223372036854775809]}\n")
    # a bound past the input's type: it loaded, and past 64 bits GET /v2/models/wide answered 500
    # (JSON's encoder refused the metadata's bound); [0, 2**40] on INT32 advertised ids no request carries
    compile_cpu_om(save_graph(counts_graph(), src / "wide.onnx"), models / "wide.om")
    (models / "wide.yaml").write_text("inputs:\n  n: {value_range: [-99999999999999999999, 99999999999999999999]}\n")
    compile_cpu_om(save_graph(token_graph(), src / "ids.onnx"), models / "ids.om")
    (models / "ids.yaml").write_text(f"inputs:\n  ids: {{value_range: [0, {2**40}]}}\n")
    with ServerThread(server_config(models, model_control_mode="none")) as srv:
        status, _, body = request(srv, "POST", "/v2/repository/index")
        metadata_status, _, _ = request(srv, "GET", "/v2/models/wide")
    index = {entry["name"]: entry for entry in json.loads(body)}
    assert status == 200
    assert index["counts"]["state"] == "UNAVAILABLE"
    assert "inputs.x.value_range: input x is FP32; a value range applies to integer inputs" in index["counts"]["reason"]
    assert "inputs.z.value_range: the model has no input 'z' (inputs: n, x)" in index["other"]["reason"]
    assert metadata_status != 500
    assert index["wide"]["state"] == index["ids"]["state"] == "UNAVAILABLE"
    int64 = "INT64 holds (-9223372036854775808..9223372036854775807)"
    assert f"inputs.n.value_range: smallest -99999999999999999999 is outside what {int64}" in index["wide"]["reason"]
    assert ("inputs.ids.value_range: largest 1099511627776 is outside what INT32 holds (-2147483648..2147483647)"
            in index["ids"]["reason"])
    assert f"inputs.n.value_range: smallest -9300000000000000000 is outside what {int64}" in index["none"]["reason"]


def test_model_defaults_range_fits_each_model_and_fails_none(tmp_path, caplog):
    """model_defaults is meant for every model: its value_range [0, 1000] failed the load of a
    model whose input is UINT8 ("largest 1000 is outside what UINT8 holds"), as did one naming
    an input a model lacks or has as FP32, and one beside an image input the model's own file
    sets. Now it is clipped to the input's type (the metadata gives the range in force), passed
    over where it cannot apply, each said in an INFO line; a model's own range past its type
    still fails its load."""
    caplog.set_level(logging.INFO, "aclserve.repository")
    src, models = tmp_path / "src", tmp_path / "models"
    src.mkdir()
    models.mkdir()
    compile_cpu_om(save_graph(counts_graph(), src / "counts.onnx"), models / "counts.om")  # n INT64, x FP32
    for name in ("bytes", "image", "own"):  # x UINT8
        compile_cpu_om(save_graph(lut_graph(), src / f"{name}.onnx"), models / f"{name}.om")
    (models / "image.yaml").write_text("inputs:\n  x: {image: {color: gray}}\n")
    (models / "own.yaml").write_text("inputs:\n  x: {value_range: [0, 1000]}\n")
    defaults = {"x": {"value_range": [0, 1000]}, "n": {"value_range": [-5, 9]}}
    config = server_config(models, model_control_mode="none", **{"model_defaults.inputs": defaults})
    with ServerThread(config) as srv:
        status, _, body = request(srv, "POST", "/v2/repository/index")
        index = {entry["name"]: entry for entry in json.loads(body)}
        metadata = {name: json.loads(request(srv, "GET", f"/v2/models/{name}")[2]) for name in ("counts", "bytes")}
        pixels = [{"name": "x", "datatype": "UINT8", "shape": [1, 4, 4, 1], "data": [255] * 16}]
        infer_status, answer = post(srv, "bytes", pixels)
        x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
        refused_status, refusal = post(srv, "counts", [{"name": "n", "datatype": "INT64", "shape": [1, 2],
                                                        "data": [0, 10]}, x])
    assert status == 200
    assert {name: entry["state"] for name, entry in index.items()} == {
        "counts": "READY", "bytes": "READY", "image": "READY", "own": "UNAVAILABLE"}
    assert ("inputs.x.value_range: largest 1000 is outside what UINT8 holds (0..255)" in index["own"]["reason"])
    ranges = {name: {i["name"]: i.get("parameters") for i in m["inputs"]} for name, m in metadata.items()}
    assert ranges == {"counts": {"n": {"value_range": [-5, 9]}, "x": None}, "bytes": {"x": {"value_range": [0, 255]}}}
    assert infer_status == 200 and answer["outputs"][0]["data"] == [1.0] * 16, answer
    assert refused_status == 400 and refusal["error"] == ("input 'n': value 10 is outside -5..9, the values the "
                                                          "model takes (model_defaults' value_range)")
    said = caplog.text
    assert "bytes:1: model_defaults' inputs.x.value_range [0, 1000] clipped to 0..255, what UINT8 holds" in said
    assert "bytes:1: model_defaults' inputs.n.value_range passed over: the model has no input 'n' (inputs: x)" in said
    assert ("counts:1: model_defaults' inputs.x.value_range passed over: input x is FP32; a value range applies to "
            "integer inputs") in said
    assert "model_defaults' inputs.x.value_range left out: the model's own inputs.x.image replaces it" in said


def tables_graph(names: str):
    """Each of `names` an INT64 [N] input looking up a [50, 2] table -> e<name> FP32 [N, 2]."""
    return helper.make_graph(
        [helper.make_node("Gather", ["table", name], [f"e{name}"], axis=0) for name in names], "tables",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["N"]) for name in names],
        [helper.make_tensor_value_info(f"e{name}", TensorProto.FLOAT, ["N", 2]) for name in names],
        [numpy_helper.from_array(np.zeros((50, 2), np.float32), "table")])


def test_model_defaults_range_never_widens_the_table_the_compile_found(tmp_path, caplog):
    """A tester's model_defaults `ids: {value_range: [0, 1000]}` replaced the 0..49 the compile
    found for a dropped model's ids: id 500 passed the check and failed on the device (500, the
    instance rebuilt for every such request). Now a default may narrow a table's range, never
    widen it, and one sharing no value with it is passed over; a model's own range still replaces
    the compile's (README)."""
    caplog.set_level(logging.INFO, "aclserve.repository")
    models = tmp_path / "models"
    models.mkdir()
    save_graph(tables_graph("abcd"), models / "e50.onnx")
    save_graph(tables_graph("a"), models / "own.onnx")
    (models / "own.yaml").write_text("inputs:\n  a: {value_range: [0, 99]}\n")
    defaults = {"a": {"value_range": [0, 1000]}, "b": {"value_range": [0, 9]}, "c": {"value_range": [-5, 20]},
                "d": {"value_range": [100, 200]}}
    config = server_config(models, model_control_mode="none", **{"model_defaults.inputs": defaults})
    with ServerThread(config) as srv:
        metadata = {name: json.loads(request(srv, "GET", f"/v2/models/{name}")[2]) for name in ("e50", "own")}
        before = metric(srv.url, "aclserve_instance_rebuilds_total", 'model="e50",version="1"')
        answers = [post(srv, "e50", [{"name": name, "datatype": "INT64", "shape": [1], "data": [ids[name]]}
                                     for name in "abcd"])
                   for ids in ({"a": 500, "b": 0, "c": 0, "d": 0}, {"a": 0, "b": 0, "c": 21, "d": 0},
                               {"a": 49, "b": 9, "c": 20, "d": 49})]
        after = metric(srv.url, "aclserve_instance_rebuilds_total", 'model="e50",version="1"')
    ranges = {name: {i["name"]: i["parameters"]["value_range"] for i in m["inputs"]} for name, m in metadata.items()}
    assert ranges == {"e50": {"a": [0, 49], "b": [0, 9], "c": [0, 20], "d": [0, 49]}, "own": {"a": [0, 99]}}
    assert answers[0] == (400, {"error": "input 'a': value 500 is outside 0..49, the values the model takes "
                                         "(it indexes a table of the model)"})
    assert answers[1] == (400, {"error": "input 'c': value 21 is outside 0..20, the values the model takes "
                                         "(model_defaults' value_range within the table the input indexes)"})
    assert answers[2][0] == 200, answers[2]
    assert after == before  # refused before the device: no instance rebuilt
    said = caplog.text
    table = "0..49, the indices of the table the input indexes"
    assert f"e50:1: model_defaults' inputs.a.value_range [0, 1000] narrowed to {table}" in said
    assert f"e50:1: model_defaults' inputs.c.value_range [-5, 20] narrowed to 0..20, within {table}" in said
    assert f"e50:1: model_defaults' inputs.d.value_range passed over: [100, 200] shares no value with {table}" in said
    assert "e50:1: model_defaults' inputs.b" not in said  # inside the table: applied as given
    # the model's own range replaces the table's, past it too, with a warning (a reviewer's)
    assert "own:1: inputs.a.value_range [0, 99] goes past 0..49, the indices of the table the input indexes" in said


def test_the_range_a_compile_prints_is_the_one_the_load_takes(tmp_path, caplog):
    """`aclserve compile` printed 0..999 (value_range: [0, 999]) for a UINT8 input indexing a
    table of 1,000, which the load clips to 0..255: copied into the .om's YAML, as the line
    invites, it failed the load ("largest 999 is outside what UINT8 holds"). Now the compile
    prints the range the load takes, saying it was clipped; the server's compile says the same."""
    caplog.set_level(logging.INFO, "aclserve.repository")
    src, models = tmp_path / "src", tmp_path / "models"
    src.mkdir()
    models.mkdir()
    save_graph(lut_graph(1000), src / "bytes.onnx")
    command = ["compile", str(src / "bytes.onnx"), "-o", str(models / "bytes.om"), "--target", "cpu"]
    compiled = subprocess.run([sys.executable, "-m", "aclserve", *command], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    printed = re.search(r"\(value_range: (\[\d+, \d+\])\)", compiled.stdout).group(1)
    (models / "bytes.yaml").write_text(f"inputs:\n  x: {{value_range: {printed}}}\n")  # as a user copies it
    save_graph(lut_graph(1000), models / "dropped.onnx")
    with ServerThread(server_config(models, model_control_mode="none")) as srv:
        index = {entry["name"]: entry for entry in json.loads(request(srv, "POST", "/v2/repository/index")[2])}
        metadata = json.loads(request(srv, "GET", "/v2/models/bytes")[2])
    assert index["bytes"]["state"] == index["dropped"]["state"] == "READY", index
    assert metadata["inputs"][0]["parameters"] == {"value_range": [0, 255]}
    said = ("input x indexes a table of the model: it takes 0..255, the table's 0..999 clipped to what UINT8 holds "
            "(value_range: [0, 255])")
    assert said in compiled.stdout.splitlines()
    assert f"dropped: {said}" in caplog.text
