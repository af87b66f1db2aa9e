"""The model's own names a request's error lists (its inputs, its outputs, the inputs missing) are
quoted as the client's name is: listed bare, inputs "a, b" and "c d" read as "a", "b", "c" and
"d" ("unknown input 'z' (model inputs: a, b, c d)"). At most MAX_LISTED_NAMES are listed, then
how many more. Over HTTP (JSON, the binary extension), gRPC (ModelInfer, ModelStreamInfer) and
`aclserve infer`'s own check alike. Real server, real clients, CPU runtime."""
import json
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, json_call, server_config
from tests.tiny_models import compile_cpu_om, save_graph

MAX_LISTED_NAMES = 16  # (aclserve/quoting.py's, as README says it)
MANY = [f"in{i:02}" for i in range(MAX_LISTED_NAMES + 24)]
LISTED = ("'a, b', 'c d'", "'s, t'")  # (model inputs, model outputs) of the model "commas"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    src, models = tmp_path_factory.mktemp("listed_src"), tmp_path_factory.mktemp("listed_models")
    vi = helper.make_tensor_value_info
    commas = helper.make_graph([helper.make_node("Add", ["a, b", "c d"], ["s, t"])], "commas",
                               [vi("a, b", TensorProto.FLOAT, ["N", 2]), vi("c d", TensorProto.FLOAT, ["N", 2])],
                               [vi("s, t", TensorProto.FLOAT, ["N", 2])])
    many = helper.make_graph([helper.make_node("Sum", MANY, ["y"])], "many",
                             [vi(name, TensorProto.FLOAT, ["N", 1]) for name in MANY],
                             [vi("y", TensorProto.FLOAT, ["N", 1])])
    for name, graph in (("commas", commas), ("many", many)):
        compile_cpu_om(save_graph(graph, src / f"{name}.onnx"), models / f"{name}.om", "1,2")
    with ServerThread(server_config(models, grpc_port=free_port(), model_control_mode="none")) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.config.grpc_port}") as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def json_error(server, model: str, doc: dict) -> str:
    status, answer = json_call(server.url, f"/v2/models/{model}/infer", json.dumps(doc).encode())
    assert status == 400, answer
    return answer["error"]


def row(name: str, width: int = 2) -> dict:
    return {"name": name, "datatype": "FP32", "shape": [1, width], "data": [1.0] * width}


def test_http_json_lists_the_models_names_quoted(server):
    assert json_error(server, "commas", {"inputs": [row("z")]}) == f"unknown input 'z' (model inputs: {LISTED[0]})"
    assert json_error(server, "commas", {"inputs": [row("a, b"), row("c d")], "outputs": [{"name": "s"}]}) == \
        f"unknown output 's' (model outputs: {LISTED[1]})"
    assert json_error(server, "commas", {"inputs": [row("a, b")]}) == "missing input(s): 'c d'"


def test_a_model_of_many_inputs_has_the_first_listed_then_how_many_more(server):
    shown = ", ".join(f"'{name}'" for name in MANY[:MAX_LISTED_NAMES])
    assert json_error(server, "many", {"inputs": [row("z", 1)]}) == \
        f"unknown input 'z' (model inputs: {shown} and 24 more)"
    assert json_error(server, "many", {"inputs": [row("in00", 1)]}) == \
        f"missing input(s): {', '.join(repr(name) for name in MANY[1:MAX_LISTED_NAMES + 1])} and 23 more"


def test_the_binary_extension_lists_them_quoted(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        given = httpclient.InferInput("z", [1, 2], "FP32")
        given.set_data_from_numpy(np.ones((1, 2), np.float32), binary_data=True)
        with pytest.raises(InferenceServerException) as e:
            client.infer("commas", [given])
    finally:
        client.close()
    assert e.value.message() == f"unknown input 'z' (model inputs: {LISTED[0]})"


def grpc_request(*names: str, outputs=()) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="commas", raw_input_contents=[np.ones((1, 2), np.float32).tobytes() for _ in names],
        inputs=[pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=[1, 2]) for name in names],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=name) for name in outputs])


@pytest.mark.parametrize("request_,message", [
    (grpc_request("z"), f"unknown input 'z' (model inputs: {LISTED[0]})"),
    (grpc_request("a, b", "c d", outputs=["s"]), f"unknown output 's' (model outputs: {LISTED[1]})"),
    (grpc_request("c d"), "missing input(s): 'a, b'"),
])
def test_grpc_lists_them_quoted_in_a_status_and_in_a_stream_error_answer(stub, request_, message):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request_)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    [answer] = list(stub.ModelStreamInfer(iter([request_])))
    assert answer.error_message == message


def test_infer_cli_lists_them_as_the_server_does(server, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "commas", "-i", "z=x.npy",
                           "--url", f"http://{server.url}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"aclserve infer: error: unknown input 'z' (model inputs: {LISTED[0]})", proc.stderr
