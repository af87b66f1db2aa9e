"""A config.pbtxt's reshape on the real server, as Triton serves it: an output's `dims` are what the
answers give (its `reshape` the model's shape), an input's `dims` what requests send (its
`reshape` the shape the model takes); metadata, /config and gRPC's ModelConfig show them. The
reshape was passed over: answers came in the model's [N, 10], requests in the config's dims were
refused 400 (a tester's Triton repository). And a max_batch_size 0 model served by rows: its
classification ranks each row (deliberately: README)."""
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import compile_cpu_om, save_graph


def double_onnx(path, shape) -> str:
    """y = 2 * x, FP32 [N, *shape]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *shape])
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], [two])
    return save_graph(graph, path)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("pbtxt_reshape")
    folders = {"out": ([10], 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
                             'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 5 ] reshape: { shape: [ 10 ] } '
                             '} ]\n'),
               "in": ([3, 2, 2], 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 12 ] reshape: { shape: '
                                 '[ 3, 2, 2 ] } } ]\n'
                                 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 2, 2 ] } ]\n')}
    # max_batch_size 0, the batch dimension first in dims: served by rows (README's max_batch_size 0)
    folders["whole"] = ([4], 'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
                             'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n')
    for name, (shape, tensors) in folders.items():
        (root / name / "1").mkdir(parents=True)
        compile_cpu_om(double_onnx(root / f"{name}.onnx", shape), root / name / "1" / "model.om")
        (root / f"{name}.onnx").unlink()
        cap = "" if name == "whole" else "max_batch_size: 8\n"
        (root / name / "config.pbtxt").write_text(f"{cap}{tensors}dynamic_batching {{ }}\n")
    with ServerThread(server_config(root, grpc_port=free_port())) as server:
        yield server


X = np.arange(30, dtype=np.float32).reshape(3, 10)


def test_an_output_reshape_is_answered_in_the_configs_dims_json_and_binary(srv):
    client = httpclient.InferenceServerClient(srv.url)
    try:
        for binary in (False, True):
            x = httpclient.InferInput("x", [3, 10], "FP32")
            x.set_data_from_numpy(X, binary_data=binary)
            result = client.infer("out", [x], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)])
            assert result.get_response()["outputs"][0]["shape"] == [3, 2, 5], binary
            np.testing.assert_array_equal(result.as_numpy("y"), (2 * X).reshape(3, 2, 5))
        # classification ranks each row's values, whatever their shape: [rows, classes]
        result = client.infer("out", [x], outputs=[httpclient.InferRequestedOutput("y", class_count=2)])
        assert result.as_numpy("y").tolist() == [[b"18.000000:9", b"16.000000:8"], [b"38.000000:9", b"36.000000:8"],
                                                 [b"58.000000:9", b"56.000000:8"]]
        assert client.get_model_metadata("out")["outputs"][0]["shape"] == [-1, 2, 5]
        assert client.get_model_config("out")["output"][0] == {"name": "y", "data_type": "TYPE_FP32", "dims": [2, 5],
                                                               "reshape": {"shape": [10]}}
    finally:
        client.close()


def test_an_output_reshape_is_answered_in_the_configs_dims_over_grpc(srv):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        x = grpcclient.InferInput("x", [3, 10], "FP32")
        x.set_data_from_numpy(X)
        result = client.infer("out", [x])
        assert list(result.get_response().outputs[0].shape) == [3, 2, 5]
        np.testing.assert_array_equal(result.as_numpy("y"), (2 * X).reshape(3, 2, 5))
        output = client.get_model_config("out").config.output[0]
        assert list(output.dims) == [2, 5] and list(output.reshape.shape) == [10]
    finally:
        client.close()


def test_an_input_reshape_takes_requests_in_the_configs_dims(srv):
    client = httpclient.InferenceServerClient(srv.url)
    try:
        rows = np.arange(24, dtype=np.float32).reshape(2, 12)
        x = httpclient.InferInput("x", [2, 12], "FP32")
        x.set_data_from_numpy(rows)
        np.testing.assert_array_equal(client.infer("in", [x]).as_numpy("y"), (2 * rows).reshape(2, 3, 2, 2))
        assert client.get_model_metadata("in")["inputs"][0]["shape"] == [-1, 12]
        assert client.get_model_config("in")["input"][0]["reshape"] == {"shape": [3, 2, 2]}
        # the model's own shape is not the config's: refused, as Triton refuses it
        x = httpclient.InferInput("x", [2, 3, 2, 2], "FP32")
        x.set_data_from_numpy(rows.reshape(2, 3, 2, 2))
        with pytest.raises(InferenceServerException, match=r"shape \[2, 3, 2, 2\] does not match"):
            client.infer("in", [x])
    finally:
        client.close()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
    try:
        x = grpcclient.InferInput("x", [2, 12], "FP32")
        x.set_data_from_numpy(rows)
        np.testing.assert_array_equal(client.infer("in", [x]).as_numpy("y"), (2 * rows).reshape(2, 3, 2, 2))
    finally:
        client.close()


def test_a_max_batch_size_0_model_served_by_rows_ranks_each_row(srv):
    """Deliberate (README, max_batch_size 0): a model whose dims begin with -1 under max_batch_size 0
    is served by rows, /config showing a max_batch_size and dims without the batch dimension; its
    classification ranks each row, as Triton ranks a model with a batch dimension. Triton, taking
    the config's 0 as none, ranks the whole tensor with flat indices ([2] here, "8:7", "7:6")."""
    rows = np.array([[1, 0, 3, 2], [4, 2, 3, 4]], np.float32)
    status, _, body = request(srv, "GET", "/v2/models/whole/config")
    config = json.loads(body)
    assert status == 200 and config["max_batch_size"] > 0 and config["input"][0]["dims"] == [4]
    for client_module, url in ((httpclient, srv.url), (grpcclient, f"127.0.0.1:{srv.config.grpc_port}")):
        client = client_module.InferenceServerClient(url)
        try:
            x = client_module.InferInput("x", [2, 4], "FP32")
            x.set_data_from_numpy(rows)
            result = client.infer("whole", [x], outputs=[client_module.InferRequestedOutput("y", class_count=2)])
            assert result.as_numpy("y").tolist() == [[b"6.000000:2", b"4.000000:3"], [b"8.000000:0", b"8.000000:3"]]
        finally:
            client.close()
