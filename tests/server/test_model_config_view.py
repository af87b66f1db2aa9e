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
        assert config["parameters"] == {"devices": {"string_value": "0"}}
        # the model still takes what its metadata says: [N]
        assert client.get_model_metadata("vec")["inputs"][0]["shape"] == [-1]
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.array([-1, 0, 2], np.float32))
        np.testing.assert_array_equal(client.infer("vec", [x]).as_numpy("y"), [0, 0, 2])
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
