"""What a gRPC conformance tester found answered differently from HTTP, or from one RPC to the
next: a classification refusal naming its output, and an empty model name; and a queue timeout's
wait said alike; an extension not offered named by its own refusal; an unknown trace setting refused
listing them all; and a sequence id refused alike; and an input in shared memory, or in typed
contents, beside raw_input_contents refused for itself, not for the count of entries. A real server
on real ports, the generated gRPC stub, tritonclient and aiohttp."""
from __future__ import annotations

import json
import re
import shutil

import grpc
import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

from tests.serving import free_port, request, server_config, started_with_grpc

EMPTY = "model name must not be empty"


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_like_http")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    # affine (gears 1, 2, 4, 8) holding a partial batch for a minute: 3 rows wait in its queue
    shutil.copy(models_dir / "affine.om", root / "slow.om")
    (root / "slow.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    yield from started_with_grpc(server_config(root, grpc_port=free_port()))


@pytest.fixture(scope="module")
def stub(srv):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def affine(model: str = "affine", rows: int = 1) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model)
    msg.inputs.add(name="x", datatype="FP32", shape=[rows, 8])
    msg.inputs.add(name="idx", datatype="INT64", shape=[rows, 3])
    msg.raw_input_contents.extend([np.ones((rows, 8), np.float32).tobytes(),
                                   np.ones((rows, 3), np.int64).tobytes()])
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


def test_every_rpc_naming_a_model_refuses_an_empty_name_alike(stub):
    calls = {
        "ModelMetadata": (stub.ModelMetadata, pb.ModelMetadataRequest(name="")),
        "ModelMetadata of a version": (stub.ModelMetadata, pb.ModelMetadataRequest(name="", version="1")),
        "ModelConfig": (stub.ModelConfig, pb.ModelConfigRequest(name="")),
        "ModelInfer": (stub.ModelInfer, affine(model="")),
        "RepositoryModelLoad": (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="")),
        "RepositoryModelUnload": (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="")),
    }
    answers = {}
    for rpc, (call, message) in calls.items():
        error = refusal(call, message)
        answers[rpc] = (error.code(), error.details())
    assert answers == {rpc: (grpc.StatusCode.INVALID_ARGUMENT, EMPTY) for rpc in calls}
    streamed = next(stub.ModelStreamInfer(iter([affine(model="")])))
    assert streamed.error_message == EMPTY
    # as Triton answers (its ModelIsReady: ready false for a name it does not know, "" too), so
    # that tritonclient's is_model_ready says False instead of raising
    assert stub.ModelReady(pb.ModelReadyRequest(name="")).ready is False


@pytest.mark.parametrize("method, path", [("GET", "/v2/models//ready"), ("GET", "/v2/models/"),
                                          ("GET", "/v2/models//versions/1/config"), ("POST", "/v2/models//infer"),
                                          ("POST", "/v2/repository/models//load")])
def test_an_empty_model_name_over_http_is_a_400_saying_so(srv, method, path):
    """No route takes an empty model name, but the request is at fault, as gRPC says (and
    Triton's HTTP answers 400), not a route that does not exist."""
    status, _, body = request(srv, method, path, data=b"{}" if method == "POST" else None)
    assert status == 400 and json.loads(body)["error"] == f"{EMPTY} ({method} {path})"


def test_a_path_that_names_no_route_is_still_a_404(srv):
    status, _, body = request(srv, "GET", "/v2/modelz//ready")
    assert status == 404 and json.loads(body)["error"] == "no route for GET /v2/modelz//ready"


def shown_wait(message: str) -> str:
    match = re.fullmatch(r"request timed out after ([0-9.]+) ms in the queue", message)
    assert match, message
    return match.group(1)


def test_a_timeout_of_a_microsecond_says_a_wait_above_zero_over_http_and_grpc(srv, stub):
    """`"timeout": 1` (us) was refused "request timed out after 0.0 ms in the queue" (a tester):
    a wait below 1 ms is said to the microsecond, over both transports. Still 503 with
    Retry-After / UNAVAILABLE, as documented (and as Triton answers a timeout in its queue)."""
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [1.0] * 24},
                      {"name": "idx", "datatype": "INT64", "shape": [3, 3], "data": [1] * 9}],
           "parameters": {"timeout": 1}}  # (3 rows fill no gear: they wait in the queue)
    status, headers, body = request(srv, "POST", "/v2/models/slow/infer", json=doc)
    assert status == 503 and "Retry-After" in headers
    msg = affine("slow", rows=3)
    msg.parameters["timeout"].int64_param = 1
    error = refusal(stub.ModelInfer, msg)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    for shown in (shown_wait(json.loads(body)["error"]), shown_wait(error.details())):
        # (a wait of 1 ms or more, on a loaded machine, is said to the tenth)
        assert float(shown) > 0 and re.fullmatch(r"0\.[0-9]{3}" if float(shown) < 1 else r"[0-9]+\.[0-9]", shown)


NOT_OFFERED = {  # extension: (a gRPC call of it, its message, an HTTP route of it)
    "system_shared_memory": ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(),
                             "/v2/systemsharedmemory/status"),
    "cuda_shared_memory": ("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name="r"),
                           "/v2/cudasharedmemory/region/r/unregister"),
    "logging": ("LogSettings", pb.LogSettingsRequest(), "/v2/logging"),
}
REASONS = {"shared memory": "send tensors in the request", "logging": "log_level"}


@pytest.mark.parametrize("extension", sorted(NOT_OFFERED))
def test_an_extension_not_offered_is_refused_naming_itself_over_grpc_as_over_http(srv, stub, extension):
    """Every such RPC answered one text for all of them, "no shared memory: ...; no log settings:
    ...", so a shared-memory caller was told about log settings and the reverse (a tester); HTTP
    named the route. Now each names its own extension and what to do instead, alike."""
    method, message, path = NOT_OFFERED[extension]
    error = refusal(getattr(stub, method), message)
    status, _, body = request(srv, "POST", path, data=b"{}")
    http = json.loads(body)["error"]
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED and status == 400
    assert error.details().startswith(f"the {extension} extension is not supported by aclserve ("), error.details()
    for topic, reason in REASONS.items():
        assert (reason in error.details()) == (topic in extension.replace("_", " ")), error.details()
    assert http == f"{path}: {error.details()}"


def test_an_unknown_trace_setting_is_refused_listing_every_setting_read_back(srv, stub):
    """The list of known settings left out trace_mode, which is read back and whose
    `opentelemetry` is refused by name (a tester): it now lists what the settings read back hold,
    over gRPC as over HTTP."""
    message = pb.TraceSettingRequest()
    message.settings["trace_colour"].value.append("red")
    error = refusal(stub.TraceSetting, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    match = re.fullmatch(r"unknown trace setting 'trace_colour' \(known: ([a-z_, ]+)\)", error.details())
    assert match, error.details()
    read_back = stub.TraceSetting(pb.TraceSettingRequest()).settings
    assert sorted(match.group(1).split(", ")) == sorted(read_back) and "trace_mode" in read_back
    status, _, body = request(srv, "POST", "/v2/trace/setting", json={"trace_colour": "red"})
    assert status == 400 and json.loads(body)["error"] == error.details()
    status, _, body = request(srv, "GET", "/v2/trace/setting")
    assert status == 200 and sorted(json.loads(body)) == sorted(read_back)


def test_an_input_sent_with_no_data_is_told_so_as_over_http(srv, stub):
    """An input with neither a raw_input_contents entry nor typed contents was refused
    "contents.fp32_contents has 0 elements but shape [1, 8] needs 8" (a tester): it now says that
    nothing was sent, as HTTP says of one without "data"; contents there but short still say the count."""
    def typed(x_values: list | None) -> pb.ModelInferRequest:
        msg = affine()
        del msg.raw_input_contents[:]
        msg.inputs[1].contents.int64_contents.extend([1] * 3)
        if x_values is not None:
            msg.inputs[0].contents.fp32_contents.extend(x_values)
        return msg
    empty_contents = typed(None)
    empty_contents.inputs[0].contents.SetInParent()  # (there, holding nothing)
    for msg in (typed(None), empty_contents):
        error = refusal(stub.ModelInfer, msg)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "input 'x' has neither raw_input_contents nor contents.fp32_contents"
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8]},
                      {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}
    status, _, body = request(srv, "POST", "/v2/models/affine/infer", json=doc)
    assert status == 400 and json.loads(body)["error"] == "input 'x' has neither data nor parameters.binary_data_size"
    short = refusal(stub.ModelInfer, typed([1.0] * 7)).details()
    assert short == "input 'x': contents.fp32_contents has 7 elements but shape [1, 8] needs 8"


def affine_doc(parameters: dict) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                       {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}],
            "parameters": parameters}


@pytest.mark.parametrize("sequence_id", [3, "abc"])
def test_a_sequence_id_is_refused_over_http_as_over_grpc(srv, stub, sequence_id):
    """No sequence batching here (README): a request naming a sequence is refused with 400, not
    served as if it were alone; gRPC refuses it with the same words."""
    status, _, body = request(srv, "POST", "/v2/models/affine/infer",
                              json=affine_doc({"sequence_id": sequence_id, "sequence_start": True}))
    assert status == 400 and json.loads(body)["error"] == "parameters.sequence_id: sequence batching is not supported"
    msg = affine()
    msg.parameters["sequence_id"].int64_param = 3
    error = refusal(stub.ModelInfer, msg)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details() == json.loads(body)["error"]


@pytest.mark.parametrize("sequence_id", [0, ""])
def test_the_sequence_id_that_means_none_is_served_its_start_and_end_ignored(srv, sequence_id):
    status, _, body = request(srv, "POST", "/v2/models/affine/infer",
                              json=affine_doc({"sequence_id": sequence_id, "sequence_start": True,
                                               "sequence_end": True}))
    assert status == 200, body


@pytest.mark.parametrize("in_shared_memory", ["x", "idx"])
def test_an_input_in_shared_memory_beside_raw_ones_is_refused_for_it_as_over_http(srv, in_shared_memory):
    """tritonclient's set_shared_memory on one input, set_data_from_numpy on the others: a
    raw_input_contents entry short for it (Triton counts none for it), so gRPC refused the count
    ("raw_input_contents has 1 entries for 2 inputs") where HTTP refused the shared memory (a
    tester). Both now name the input and the shared memory."""
    data = {"x": np.ones((1, 8), np.float32), "idx": np.ones((1, 3), np.int64)}
    answers = []
    for client in (tritonclient.grpc, tritonclient.http):
        inputs = []
        for name, array in data.items():
            tensor = client.InferInput(name, list(array.shape), "FP32" if name == "x" else "INT64")
            if name == in_shared_memory:
                tensor.set_shared_memory("region0", array.nbytes)
            else:
                tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        url = srv.grpc_url if client is tritonclient.grpc else srv.url
        with pytest.raises(InferenceServerException) as refused:
            client.InferenceServerClient(url).infer("affine", inputs)
        answers.append(refused.value.message())
    assert answers == [f"input '{in_shared_memory}': shared_memory_region: shared memory is not supported "
                       f"by this server"] * 2


def test_typed_contents_beside_raw_ones_are_refused_naming_the_input(stub):
    """The KServe SDK's InferenceGRPCClient sends an input set with binary_data=True in
    raw_input_contents and the others in typed contents: refused for the count of entries (a
    tester), never reaching the refusal that says what to change."""
    msg = affine()
    del msg.raw_input_contents[:]
    msg.inputs[0].contents.fp32_contents.extend([1.0] * 8)
    msg.raw_input_contents.append(np.ones((1, 3), np.int64).tobytes())
    error = refusal(stub.ModelInfer, msg)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("input 'x' has contents but the request uses raw_input_contents "
                               "(use one or the other for every input)")
    msg.inputs.add(name="extra", datatype="FP32", shape=[1])  # one entry short still, once the ways agree
    del msg.raw_input_contents[:]
    msg.inputs[0].ClearField("contents")
    msg.raw_input_contents.extend([np.ones((1, 8), np.float32).tobytes(), np.ones((1, 3), np.int64).tobytes()])
    assert refusal(stub.ModelInfer, msg).details() == ("raw_input_contents has 2 entries for 3 inputs "
                                                       "(one per input, in inputs order)")
