"""What a gRPC conformance tester found answered differently from HTTP: a classification
refusal naming its output. A real server on real ports, the generated gRPC stub and aiohttp."""
from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.serving import free_port, request, server_config, started_with_grpc


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_like_http")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    yield from started_with_grpc(server_config(root, grpc_port=free_port()))


@pytest.fixture(scope="module")
def stub(srv):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def affine(model: str = "affine") -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model)
    msg.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    msg.inputs.add(name="idx", datatype="INT64", shape=[1, 3])
    msg.raw_input_contents.extend([np.ones((1, 8), np.float32).tobytes(), np.ones((1, 3), np.int64).tobytes()])
    return msg


def refusal(call, message) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(message)
    return e.value


def test_a_negative_classification_is_refused_naming_its_output_as_over_http(srv, stub):
    msg = affine()
    msg.outputs.add(name="y").parameters["classification"].int64_param = -1
    error = refusal(stub.ModelInfer, msg)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                      {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}],
           "outputs": [{"name": "y", "parameters": {"classification": -1}}]}
    status, _, body = request(srv, "POST", "/v2/models/affine/infer", json=doc)
    http = json.loads(body)["error"]
    assert status == 400 and http == "output 'y': parameters.classification must be a non-negative integer"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith(http), error.details()
    assert "int64_param" in error.details()  # and which parameter kinds gRPC takes

