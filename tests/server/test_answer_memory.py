"""A request's answer is charged to the memory budget before the request is queued: a model
whose outputs are far larger than its inputs ("wide": one number in, 65,536 out per row) cannot
make the server hold more than max_request_bytes per request through its answers. Real server,
real ports, tritonclient over HTTP and gRPC."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from aclserve.server.answer_size import CLASS_ENTRY_BYTES, JSON_BYTES_PER_VALUE, answer_bytes
from aclserve.server.codec import InferRequest, RequestedOutput, Signature
from aclserve.runtime.types import TensorSpec

from tests.serving import ServerThread, free_port, server_config
from tests.tiny_models import compile_cpu_om, save_graph

from .hostile import metric

WIDE = 65536
MiB = 1 << 20


def wide_onnx(path) -> str:
    """y = x * ones (FP32 [N,1] -> [N,65536]): 256 KiB of output per row, 1.6 MB as JSON."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDE])
    ones = numpy_helper.from_array(np.ones((1, WIDE), np.float32), "ones")
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "ones"], ["y"])], "wide", [x], [y], [ones]),
                      path)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One row's binary answer (2 x 256 KiB over HTTP, 3 x over gRPC) fits 1 MiB; its JSON
    answer (256 KiB + 1.6 MB) does not."""
    root = tmp_path_factory.mktemp("wide")
    compile_cpu_om(wide_onnx(root / "wide.onnx"), root / "wide.om", batch="1,2")
    (root / "wide.onnx").unlink()
    config = server_config(root, grpc_port=free_port(), model_control_mode="none",
                           max_request_bytes=MiB, max_inflight_bytes=4 * MiB)
    with ServerThread(config) as srv:
        srv.grpc_url = f"127.0.0.1:{config.grpc_port}"
        yield srv


def http_infer(url: str, rows: int, binary_output: bool):
    x = httpclient.InferInput("x", [rows, 1], "FP32")
    x.set_data_from_numpy(np.full((rows, 1), 0.5, np.float32))
    with httpclient.InferenceServerClient(url) as client:
        return client.infer("wide", [x], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary_output)])


def executions(url: str) -> int:
    with httpclient.InferenceServerClient(url) as client:
        return client.get_inference_statistics("wide")["model_stats"][0]["execution_count"]


def need_and_limit(message: str) -> tuple[str, str]:
    """The request's need and the per-request limit as a 413's message prints them."""
    return (re.search(r"needs about (.+?) of server memory", message).group(1),
            re.search(r"per-request limit of (.+?) \(max_request_bytes\)", message).group(1))


def test_json_outputs_too_large_for_the_request_limit_are_refused_before_running(wide):
    runs = executions(wide.url)
    with pytest.raises(InferenceServerException) as refused:
        http_infer(wide.url, 1, binary_output=False)
    assert refused.value.status() == "413"
    assert "its answer" in refused.value.message() and "max_request_bytes" in refused.value.message()
    assert "ask for binary outputs" in refused.value.message()  # what would need less
    assert executions(wide.url) == runs  # never ran
    result = http_infer(wide.url, 1, binary_output=True)  # the same answer in binary fits
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, WIDE), 0.5, np.float32))
    assert executions(wide.url) == runs + 1
    assert metric(wide.url, "aclserve_request_memory_bytes") == 0  # every charge given back


def test_rows_count_in_the_answer(wide):
    """Two rows' binary answer (1 MiB over HTTP) is over the limit too, by the request body's
    few hundred bytes: its need does not print as the limit (both were "1.0 MiB"), and the
    advice is fewer rows, not the binary outputs it already asked for."""
    with pytest.raises(InferenceServerException) as refused:
        http_infer(wide.url, 2, binary_output=True)
    message = refused.value.message()
    assert refused.value.status() == "413" and "its answer" in message
    need, limit = need_and_limit(message)
    assert need != limit and limit == f"{MiB:,} bytes", message
    assert message.endswith("; send fewer rows per request"), message


def test_grpc_answers_are_charged_too(wide):
    def infer(rows: int):
        x = grpcclient.InferInput("x", [rows, 1], "FP32")
        x.set_data_from_numpy(np.full((rows, 1), 0.5, np.float32))
        with grpcclient.InferenceServerClient(wide.grpc_url) as client:
            return client.infer("wide", [x])
    assert infer(1).as_numpy("y").shape == (1, WIDE)
    with pytest.raises(InferenceServerException) as refused:
        infer(2)  # 3 x 512 KiB
    message = refused.value.message()
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "its answer" in message
    # its tensors came in raw_input_contents: typed contents are not what made it too large
    assert message.endswith("; send fewer rows per request"), message


def test_answer_bytes_counts_arrays_encodings_and_classification():
    spec = TensorSpec("y", "FP32", np.dtype(np.float32), (-1, 10, -1))  # an open dimension counts as 1
    static = TensorSpec("z", "INT64", np.dtype(np.int64), (3,))
    sig = Signature([], [spec, static], 8)
    req = InferRequest(inputs={}, rows=4)
    array = 4 * 10 * 4
    assert answer_bytes(sig, req, binary_copies=1, json_outputs=True) == \
        array + 40 * JSON_BYTES_PER_VALUE + 24 + 3 * JSON_BYTES_PER_VALUE
    req.binary_output = True
    assert answer_bytes(sig, req, binary_copies=1, json_outputs=True) == 2 * array + 2 * 24
    assert answer_bytes(sig, req, binary_copies=2, json_outputs=False) == 3 * array + 3 * 24
    req.outputs = [RequestedOutput("y", binary=False, classification=3)]
    assert answer_bytes(sig, req, binary_copies=1, json_outputs=True) == array + 4 * 3 * CLASS_ENTRY_BYTES
