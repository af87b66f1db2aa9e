"""The metadata of an input with no dimension but the batch ([N]; a static scalar, []) gives its
/config dims after the batch's -1, as Triton derives it: [-1, 1] (a static scalar [1]). It gave
[-1] ([]), and perf_analyzer, which drops the batch from the metadata's shape, was left with no
dimension and sent nothing: "unable to set shape for the input" (found by a tester, over HTTP and
gRPC). Outputs keep their answers' shape in the metadata; requests are taken in either shape."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from aclserve.cli.profile import _body
from aclserve.cli.profile_remote import _inputs
from tests import REPO
from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import compile_cpu_om, save_graph

sys.path.insert(0, os.path.join(REPO, "tools"))

from bench_grpc import find_perf_analyzer  # noqa: E402

# model: (input metadata shape, output metadata shape)
SHAPES = {"vec": ([-1, 1], [-1]), "scalar": ([1], [])}


def relu_onnx(path, dims: list) -> str:
    """y = relu(x), FP32 of `dims` in and out."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    return save_graph(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y]), path)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_only")
    compile_cpu_om(relu_onnx(root / "vec.onnx", ["N"]), root / "vec.om")  # batch sizes 1-8
    compile_cpu_om(relu_onnx(root / "scalar.onnx", []), root / "scalar.om", batch=None)  # max_batch_size 0
    for onnx_file in root.glob("*.onnx"):
        onnx_file.unlink()
    with ServerThread(server_config(root, grpc_port=free_port())) as server:
        yield server


def grpc_address(server) -> str:
    return f"127.0.0.1:{server.config.grpc_port}"


def test_metadata_gives_an_input_its_config_dims_and_an_output_its_answers_shape(srv):
    http = httpclient.InferenceServerClient(srv.url)
    grpc = grpcclient.InferenceServerClient(grpc_address(srv))
    try:
        for model, (input_shape, output_shape) in SHAPES.items():
            meta = http.get_model_metadata(model)
            assert (meta["inputs"][0]["shape"], meta["outputs"][0]["shape"]) == (input_shape, output_shape), model
            config = http.get_model_config(model)
            batch = [-1] if config["max_batch_size"] > 0 else []
            assert batch + config["input"][0]["dims"] == input_shape, config
            from_grpc = grpc.get_model_metadata(model)
            assert (list(from_grpc.inputs[0].shape), list(from_grpc.outputs[0].shape)) == (input_shape, output_shape)
    finally:
        http.close()
        grpc.close()


def rows_of(shape: list, rows: int) -> list:
    return [rows if d == -1 else d for d in shape]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_request_in_the_metadata_s_shape_or_the_model_s_is_answered_in_the_output_s(srv, binary):
    """A client building its input from the metadata sends [3, 1] ([1]); one sending the model's own
    shape, [3] ([]), is answered as before; the answer has the output's metadata shape both times."""
    http = httpclient.InferenceServerClient(srv.url)
    grpc = grpcclient.InferenceServerClient(grpc_address(srv))
    try:
        for model, (input_shape, output_shape) in SHAPES.items():
            answered = rows_of(output_shape, 3)
            for shape in (rows_of(input_shape, 3), answered):
                values = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
                wanted = np.maximum(values, 0).reshape(answered)
                x = httpclient.InferInput("x", shape, "FP32")
                x.set_data_from_numpy(values, binary_data=binary)
                got = http.infer(model, [x]).as_numpy("y")
                assert got.shape == tuple(answered), (model, shape)
                np.testing.assert_array_equal(got, wanted)
                x = grpcclient.InferInput("x", shape, "FP32")
                x.set_data_from_numpy(values)
                np.testing.assert_array_equal(grpc.infer(model, [x]).as_numpy("y"), wanted)
    finally:
        http.close()
        grpc.close()


def test_a_shape_refused_names_both_shapes_the_model_takes(srv):
    """The refusal said "the model's [-1]" where the metadata says [-1, 1]: it names both now, over
    HTTP and gRPC."""
    http = httpclient.InferenceServerClient(srv.url)
    grpc = grpcclient.InferenceServerClient(grpc_address(srv))
    try:
        for model, shape, said in (("vec", [3, 2], r"shape \[3, 2\] does not match the model's \[-1\] or \[-1, 1\]$"),
                                   ("scalar", [2], r"shape \[2\] does not match the model's \[\] or \[1\]$")):
            x = httpclient.InferInput("x", shape, "FP32")
            x.set_data_from_numpy(np.zeros(shape, np.float32))
            with pytest.raises(InferenceServerException, match=said) as refused:
                http.infer(model, [x])
            assert refused.value.status() == "400"
            x = grpcclient.InferInput("x", shape, "FP32")
            x.set_data_from_numpy(np.zeros(shape, np.float32))
            with pytest.raises(InferenceServerException, match=said) as refused:
                grpc.infer(model, [x])
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        http.close()
        grpc.close()


def test_profile_url_builds_requests_the_server_takes_from_the_metadata(srv):
    """`aclserve profile --url` makes its requests from the metadata's shapes: [2, 1] and [1] now."""
    for model, rows in (("vec", 2), ("scalar", 1)):
        status, _, meta = request(srv, "GET", f"/v2/models/{model}")
        assert status == 200
        body, header_length = _body(_inputs(json.loads(meta)), rows)
        status, _, answer = request(srv, "POST", f"/v2/models/{model}/infer", data=body,
                                          headers={"Inference-Header-Content-Length": str(header_length)})
        assert status == 200, answer


def test_perf_analyzer_runs_the_models_with_no_shape_given(srv):
    """The tester's command, over HTTP and gRPC (a fixed request count: no measuring to a stable rate)."""
    perf_analyzer = find_perf_analyzer(None)
    if perf_analyzer is None:
        pytest.skip("no perf_analyzer (PATH or out/perf-analyzer: python tools/install_perf_analyzer.py)")
    for model in SHAPES:
        for protocol, address in (("http", srv.url), ("grpc", grpc_address(srv))):
            run = subprocess.run([perf_analyzer, "-m", model, "-u", address, "-i", protocol, "--concurrency-range", "1",
                                  "--request-count", "10"], capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, (model, protocol, run.stdout[-2000:], run.stderr[-2000:])
