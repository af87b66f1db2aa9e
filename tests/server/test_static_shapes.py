"""Models without a batch dimension whose first dimension is not 1 (a fixed [2, 3] input, a
static batch of 4 compiled with `--batch 4`): one request fills the whole tensor. Packing cut it
to its first row, so the warm-up failed, the model was retried as if the device had failed
and never served. A host-code error in a warm-up batch is not retried as a device fault."""
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from aclserve.acl import AclError
from aclserve.errors import ExecutionFailed
from aclserve.repository.retry import is_transient
from tests.serving import ServerThread, server_config
from tests.tiny_models import compile_cpu_om, save_graph, scale_onnx


def tripled_onnx(path, shape) -> str:
    """y = 3x for a fixed-shape x (no batch dimension)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    three = numpy_helper.from_array(np.array(3, np.float32), "three")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["y"])], "tripled", [x], [y], [three])
    return save_graph(graph, path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    src, models = tmp_path_factory.mktemp("static_src"), tmp_path_factory.mktemp("static_models")
    compile_cpu_om(tripled_onnx(src / "fixed.onnx", [2, 3]), models / "fixed.om", batch=None)
    compile_cpu_om(scale_onnx(src / "scale.onnx", 2.0), models / "four.om", batch="4")
    with ServerThread(server_config(models, model_control_mode="none")) as server:
        yield server


@pytest.mark.parametrize("binary", [True, False])
def test_a_fixed_shape_model_is_served(server, binary):
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.is_server_ready() and client.is_model_ready("fixed") and client.is_model_ready("four")
        meta = client.get_model_metadata("four")
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        given = httpclient.InferInput("x", [2, 3], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        np.testing.assert_array_equal(client.infer("fixed", [given]).as_numpy("y"), 3 * x)
        shape = meta["inputs"][0]["shape"]
        rows = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        given = httpclient.InferInput(meta["inputs"][0]["name"], shape, "FP32")
        given.set_data_from_numpy(rows, binary_data=binary)
        answer = client.infer("four", [given]).as_numpy(meta["outputs"][0]["name"])
        assert shape[0] == 4
        np.testing.assert_allclose(answer, 2 * rows)
    finally:
        client.close()


def test_a_host_code_error_in_a_batch_is_not_a_transient_device_fault():
    bug = ExecutionFailed("batch of 1 row could not run on device 0")
    bug.__cause__ = ValueError("could not broadcast input array from shape (4,4) into shape (1,4)")
    device = ExecutionFailed("batch of 1 row failed on device 0")
    device.__cause__ = AclError("mdl.execute_async", 507011)
    assert not is_transient(bug)
    assert is_transient(device) and is_transient(ExecutionFailed("instance closed before the batch could run"))
