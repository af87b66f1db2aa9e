"""/config and gRPC ModelConfig as Triton's own tools accept them: no empty dims, no gpus
beside KIND_MODEL (Triton's config validation refuses both)."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.serving import ServerThread, free_port, server_config
from tests.tiny_models import compile_cpu_om, save_graph


def batch_only_onnx(path) -> str:
    """y = relu(x), FP32 [N] -> [N]: tensors with no dimension but the batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])
    return save_graph(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "vec", [x], [y]), path)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("config_view")
    compile_cpu_om(batch_only_onnx(root / "vec.onnx"), root / "vec.om")
    # one request per run: gears up to 32 with batching off, and a static model
    compile_cpu_om(root / "vec.onnx", root / "alone.om", batch="1,2,4,8,16,32")
    (root / "alone.yaml").write_text("batching: {enabled: false, priority_queue_policy: "
                                     "{1: {max_queue_size: 4, default_timeout_ms: 500}}}\n")
    compile_cpu_om(root / "vec.onnx", root / "fixed.om", batch="1")
    # Triton folders: dynamic_batching without priority levels (batching, and one request per run), with two
    for name, pbtxt in (("tri", "max_batch_size: 8\ndynamic_batching { }\n"),
                        ("tri_alone", 'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                                      'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                                      "dynamic_batching { }\n"),
                        ("tri_levels", "max_batch_size: 8\ndynamic_batching { priority_levels: 2 "
                                       "default_priority_level: 1 }\n")):
        (root / name / "1").mkdir(parents=True)
        compile_cpu_om(root / "vec.onnx", root / name / "1" / "model.om")
        (root / name / "config.pbtxt").write_text(pbtxt)
    (root / "vec.onnx").unlink()
    with ServerThread(server_config(root, grpc_port=free_port())) as server:
        yield server


def test_batch_only_tensors_have_one_dim_reshaped_to_none(srv):
    client = httpclient.InferenceServerClient(srv.url)
    try:
        config = client.get_model_config("vec")
        assert config["max_batch_size"] == 8
        for tensor in config["input"] + config["output"]:
            assert tensor["dims"] == [1] and tensor["reshape"] == {"shape": []}, tensor
        assert config["instance_group"] == [{"name": "vec_0", "kind": "KIND_MODEL", "count": 1}]
        assert config["parameters"]["devices"] == {"string_value": "0"}
        # the metadata gives the input the config's dims, as Triton does, the output its answers' [N];
        # the model still takes its own [N]
        meta = client.get_model_metadata("vec")
        assert (meta["inputs"][0]["shape"], meta["outputs"][0]["shape"]) == ([-1, 1], [-1])
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.array([-1, 0, 2], np.float32))
        np.testing.assert_array_equal(client.infer("vec", [x]).as_numpy("y"), [0, 0, 2])
    finally:
        client.close()


def test_every_input_s_metadata_shape_is_its_config_dims_after_the_batch(srv):
    """As Triton derives the metadata from the config (test_batch_only_metadata.py): batching or
    not, static, from a config.pbtxt."""
    client = httpclient.InferenceServerClient(srv.url)
    try:
        for model in ("vec", "alone", "fixed", "tri", "tri_alone", "tri_levels"):
            config, meta = client.get_model_config(model), client.get_model_metadata(model)
            batch = [-1] if config["max_batch_size"] > 0 else []
            assert [t["shape"] for t in meta["inputs"]] == [batch + t["dims"] for t in config["input"]], model
    finally:
        client.close()


def test_grpc_model_config_carries_the_same(srv):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        config = client.get_model_config("vec").config
        assert list(config.input[0].dims) == [1] and config.input[0].HasField("reshape")
        assert list(config.input[0].reshape.shape) == [] and list(config.output[0].dims) == [1]
        assert len(config.instance_group) == 1 and list(config.instance_group[0].gpus) == []
        assert config.parameters["devices"].string_value == "0"
    finally:
        client.close()


def queue_parameters(parameters: dict) -> dict:
    return {name: value for name, value in parameters.items() if name != "devices"}


def test_a_model_of_one_request_per_run_shows_its_queue_limits_in_parameters(srv):
    """Levels and queue limits hold on a model that does not batch, but Triton's ModelConfig has
    them only in dynamic_batching, which such a model is shown without: /config gave no limit while
    the queue answered 503 "priority level 2 queue is full" (an independent check). They are string
    parameters named after dynamic_batching's fields; `auto` counts a full batch as one request
    there (not the largest gear: 8 x 32 = 256 lone runs a level), so the queue takes MIN_QUEUE.
    An auto size counts rows, which Triton's field cannot say: a parameter names the unit."""
    client = httpclient.InferenceServerClient(srv.url)
    try:
        alone, fixed = client.get_model_config("alone"), client.get_model_config("fixed")
        assert "dynamic_batching" not in alone and "dynamic_batching" not in fixed
        assert (alone["max_batch_size"], fixed["max_batch_size"]) == (32, 0)
        shown = {name: value["string_value"] for name, value in queue_parameters(alone["parameters"]).items()}
        deadline = shown.pop("default_queue_policy.default_timeout_microseconds")
        assert int(deadline) >= 2_000_000  # auto: at least MIN_DEADLINE_MS
        assert shown == {
            "priority_levels": "3", "default_priority_level": "2", "preserve_ordering": "false",
            "default_queue_policy.timeout_action": "REJECT", "default_queue_policy.allow_timeout_override": "true",
            "default_queue_policy.max_queue_size": "64", "default_queue_policy.max_queue_size_unit": "rows",
            "priority_queue_policy.1.timeout_action": "REJECT",
            "priority_queue_policy.1.allow_timeout_override": "true",
            "priority_queue_policy.1.default_timeout_microseconds": "500000",
            "priority_queue_policy.1.max_queue_size": "4"}  # configured: requests, no unit shown
        static = {name: value["string_value"] for name, value in queue_parameters(fixed["parameters"]).items()}
        assert static["default_queue_policy.max_queue_size"] == "64" and static["priority_levels"] == "3"
        assert static["default_queue_policy.max_queue_size_unit"] == "rows"
        assert "priority_queue_policy.1.max_queue_size" not in static
        # a batching model has them in dynamic_batching, and only the auto size's unit elsewhere
        vec = client.get_model_config("vec")
        assert vec["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
        unit = {"default_queue_policy.max_queue_size_unit": {"string_value": "rows"}}
        assert queue_parameters(vec["parameters"]) == unit
    finally:
        client.close()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        from_grpc = grpc.get_model_config("alone", as_json=True)["config"]
        assert not from_grpc.get("dynamic_batching") and from_grpc["parameters"] == alone["parameters"]
    finally:
        grpc.close()


def test_a_config_pbtxt_without_priority_levels_shows_priorities_off_as_triton(srv):
    """Triton's `dynamic_batching { }` has priority_levels 0: priorities off. /config showed
    priority_levels 1 and default_priority_level 1 (the one level it runs as), and a client taking
    priority_levels > 0 for "priorities on" thought them on. Shown 0 and 0 as Triton shows them,
    over HTTP and gRPC, and in the parameters of one shown without dynamic_batching; levels the file
    gives are shown as given; requests run as before, a priority or none."""
    client = httpclient.InferenceServerClient(srv.url)
    try:
        dynamic = client.get_model_config("tri")["dynamic_batching"]
        assert (dynamic["priority_levels"], dynamic["default_priority_level"]) == (0, 0)
        assert dynamic["priority_queue_policy"] == {}
        alone = client.get_model_config("tri_alone")
        assert "dynamic_batching" not in alone
        assert (alone["parameters"]["priority_levels"], alone["parameters"]["default_priority_level"]) \
            == ({"string_value": "0"}, {"string_value": "0"})
        given = client.get_model_config("tri_levels")["dynamic_batching"]
        assert (given["priority_levels"], given["default_priority_level"]) == (2, 1)
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.array([-1, 0, 2], np.float32))
        for priority in (0, 1, 2):
            np.testing.assert_array_equal(client.infer("tri", [x], priority=priority).as_numpy("y"), [0, 0, 2])
    finally:
        client.close()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        dynamic = grpc.get_model_config("tri").config.dynamic_batching
        assert (dynamic.priority_levels, dynamic.default_priority_level) == (0, 0)
    finally:
        grpc.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_batch_only_inputs_are_taken_as_the_config_spells_them_too(srv, binary):
    """A client that builds its inputs from /config (dims [1] after the batch) sends [N, 1], as
    Triton takes it: taken as [N] (the answer keeps the metadata's [N]). Over gRPC too, and a
    trailing dimension other than 1 is still refused."""
    client = httpclient.InferenceServerClient(srv.url)
    try:
        x = httpclient.InferInput("x", [3, 1], "FP32")
        x.set_data_from_numpy(np.array([[-1], [0], [2]], np.float32), binary_data=binary)
        np.testing.assert_array_equal(client.infer("vec", [x]).as_numpy("y"), [0, 0, 2])
        bad = httpclient.InferInput("x", [3, 2], "FP32")
        bad.set_data_from_numpy(np.zeros((3, 2), np.float32), binary_data=binary)
        with pytest.raises(Exception, match=r"shape \[3, 2\] does not match the model's \[-1\]"):
            client.infer("vec", [bad])
    finally:
        client.close()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        x = grpcclient.InferInput("x", [3, 1], "FP32")
        x.set_data_from_numpy(np.array([[-1], [0], [2]], np.float32))
        np.testing.assert_array_equal(grpc.infer("vec", [x]).as_numpy("y"), [0, 0, 2])
    finally:
        grpc.close()


def pictures_onnx(path) -> str:
    """Relu of each input: `nchw` FP32 [N, 3, 8, 8], `nhwc` UINT8 [N, 8, 8, 3] (through a Cast),
    `grid` FP32 [N, 5, 4, 4] (no picture: 5 channels)."""
    def tensor(name, elem, dims):
        return helper.make_tensor_value_info(name, elem, ["batch", *dims])
    inputs = [tensor("nchw", TensorProto.FLOAT, [3, 8, 8]), tensor("nhwc", TensorProto.UINT8, [8, 8, 3]),
              tensor("grid", TensorProto.FLOAT, [5, 4, 4])]
    outputs = [tensor("y_nchw", TensorProto.FLOAT, [3, 8, 8]), tensor("y_nhwc", TensorProto.FLOAT, [8, 8, 3]),
               tensor("y_grid", TensorProto.FLOAT, [5, 4, 4])]
    nodes = [helper.make_node("Relu", ["nchw"], ["y_nchw"]),
             helper.make_node("Cast", ["nhwc"], ["nhwc_f"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["nhwc_f"], ["y_nhwc"]),
             helper.make_node("Relu", ["grid"], ["y_grid"])]
    return save_graph(helper.make_graph(nodes, "pictures", inputs, outputs), path)


def test_picture_inputs_name_their_layout_as_triton_image_client_needs(tmp_path):
    """An input of three dimensions besides the batch with 1 or 3 channels first or last says
    FORMAT_NCHW / FORMAT_NHWC in its config (Triton's image_client refuses FORMAT_NONE); any
    other input, and a static model's (four dims), FORMAT_NONE, over HTTP and gRPC."""
    compile_cpu_om(pictures_onnx(tmp_path / "pictures.onnx"), tmp_path / "pictures.om")
    compile_cpu_om(tmp_path / "pictures.onnx", tmp_path / "fixed.om", batch="1")
    (tmp_path / "pictures.onnx").unlink()
    wanted = {"nchw": "FORMAT_NCHW", "nhwc": "FORMAT_NHWC", "grid": "FORMAT_NONE"}
    with ServerThread(server_config(tmp_path, grpc_port=free_port())) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.config.grpc_port}")
        try:
            config = http.get_model_config("pictures")
            assert {t["name"]: t["format"] for t in config["input"]} == wanted
            assert all("format" not in t for t in config["output"])
            from_grpc = grpc.get_model_config("pictures", as_json=True)["config"]  # (JSON leaves out FORMAT_NONE)
            assert {t["name"]: t.get("format", "FORMAT_NONE") for t in from_grpc["input"]} == wanted
            fixed = http.get_model_config("fixed")
            assert fixed["max_batch_size"] == 0
            assert {t["name"]: (t["dims"], t["format"]) for t in fixed["input"]} == {
                "nchw": ([1, 3, 8, 8], "FORMAT_NONE"), "nhwc": ([1, 8, 8, 3], "FORMAT_NONE"),
                "grid": ([1, 5, 4, 4], "FORMAT_NONE")}
        finally:
            http.close()
            grpc.close()


@pytest.mark.parametrize("om_format, dims, datatype, said", [
    ("NCHW", [3, 224, 224], "FP32", "FORMAT_NCHW"), ("NCHW", [224, 224, 3], "FP32", "FORMAT_NHWC"),
    ("NHWC", [224, 224, 1], "UINT8", "FORMAT_NHWC"),
    ("NHWC", [224, 224, 4], "UINT8", "FORMAT_NONE"),  # (image_client would feed 4 channels as RGB)
    ("NCHW", [3, -1, -1], "FP32", "FORMAT_NONE"),  # (an ATC OM with dynamic H and W: a resize to -1)
    ("NCHW", [16, 32, 32], "FP32", "FORMAT_NONE"), ("ND", [8, 8], "FP32", "FORMAT_NONE"),
    ("ND", [1], "BYTES", "FORMAT_NONE"), ("ND", [], "FP32", "FORMAT_NONE")])
def test_an_input_format_is_named_only_for_a_picture_of_fixed_size(om_format, dims, datatype, said):
    from aclserve.dtypes import kserve_to_numpy
    from aclserve.runtime.types import TensorSpec
    from aclserve.server.model_info import _input_format
    dtype = np.dtype(object) if datatype == "BYTES" else kserve_to_numpy(datatype)
    spec = TensorSpec("x", datatype, dtype, (-1, *dims), om_format)
    assert _input_format(spec, dims) == said
