"""Bad gRPC requests get a status that names the problem (never INTERNAL, never a traceback), the
server keeps serving, and shutdown drains gRPC requests like HTTP ones."""
import asyncio
import shutil
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from aclserve.server.grpc_server import GrpcServer
from aclserve.server.grpc_wire import MAX_FIELDS, MAX_PARAMETERS

from tests.images.images_data import encode
from tests.server.grpc_raw import INFER
from tests.serving import ServerThread, free_port, server_config, started_app
from tests.tiny_models import compile_cpu_om, conv_onnx

INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
X = np.ones((2, 8), np.float32)
IDX = np.ones((2, 3), np.int64)


@pytest.fixture(scope="module")
def channel(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_hostile")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    with ServerThread(server_config(root, grpc_port=free_port(), model_control_mode="none")) as srv:
        with grpc.insecure_channel(f"127.0.0.1:{srv.config.grpc_port}") as channel:
            yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return pbg.GRPCInferenceServiceStub(channel)


def good(**fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="affine", **fields)
    request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
    request.inputs.add(name="idx", datatype="INT64", shape=[2, 3])
    request.raw_input_contents.extend([X.tobytes(), IDX.tobytes()])
    return request


def edit(change):
    def build():
        request = good()
        change(request)
        return request
    return build


def param(request, key, **value):
    request.parameters[key].CopyFrom(pb.InferParameter(**value))


def typed(request):
    del request.raw_input_contents[:]
    request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    request.inputs[1].contents.int64_contents.extend([1] * 6)


HOSTILE = {
    "no model name": (edit(lambda r: setattr(r, "model_name", "")), INVALID, "model name must not be empty"),
    "unknown model": (edit(lambda r: setattr(r, "model_name", "nope")), NOT_FOUND, "unknown model"),
    "unknown version": (edit(lambda r: setattr(r, "model_version", "7")), NOT_FOUND, "no version 7"),
    "5000-digit version": (edit(lambda r: setattr(r, "model_version", "9" * 5000)), INVALID, "at most 18 digits"),
    "no inputs": (lambda: pb.ModelInferRequest(model_name="affine"), INVALID, "inputs"),
    "unknown input": (edit(lambda r: setattr(r.inputs[0], "name", "z")), INVALID, "unknown input 'z'"),
    "input twice": (edit(lambda r: setattr(r.inputs[1], "name", "x")), INVALID, "more than once"),
    "wrong datatype": (edit(lambda r: setattr(r.inputs[0], "datatype", "FP16")), INVALID, "FP16"),
    "BYTES": (edit(lambda r: setattr(r.inputs[0], "datatype", "BYTES")), INVALID, "BYTES is not supported"),
    "negative dim": (edit(lambda r: r.inputs[0].shape.__setitem__(1, -8)), INVALID, "shape"),
    "wrong rank": (edit(lambda r: r.inputs[0].shape.append(1)), INVALID, "does not match"),
    "zero rows": (edit(lambda r: r.inputs[0].shape.__setitem__(0, 0)), INVALID, "at least 1"),
    "too many rows": (edit(lambda r: r.inputs[0].shape.__setitem__(0, 2**62)), INVALID, "max_batch_size"),
    "row mismatch": (edit(lambda r: r.inputs[1].shape.__setitem__(0, 1)), INVALID, "differs"),
    "raw count": (edit(lambda r: r.raw_input_contents.pop()), INVALID, "raw_input_contents has 1"),
    "raw size": (edit(lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 7)), INVALID, "has 7 bytes"),
    "raw and contents": (edit(lambda r: r.inputs[0].contents.fp32_contents.append(1.0)), INVALID, "one or the other"),
    "missing input": (edit(lambda r: (r.inputs.pop(), r.raw_input_contents.pop())), INVALID, "missing input"),
    "contents wrong field": (edit(lambda r: (typed(r), r.inputs[0].contents.int_contents.append(1))),
                             INVALID, "int_contents given for FP32"),
    "contents count": (edit(lambda r: (typed(r), r.inputs[1].contents.int64_contents.pop())), INVALID,
                       "has 5 elements"),
    "contents none": (edit(lambda r: (typed(r), r.inputs[0].ClearField("contents"))), INVALID,
                      "input 'x' has neither raw_input_contents nor contents.fp32_contents"),
    "priority string": (edit(lambda r: param(r, "priority", string_param="1")), INVALID, "priority"),
    "priority negative": (edit(lambda r: param(r, "priority", int64_param=-1)), INVALID, "priority"),
    "timeout double": (edit(lambda r: param(r, "timeout", double_param=1.5)), INVALID, "timeout"),
    "timeout empty": (edit(lambda r: r.parameters["timeout"].Clear()), INVALID, "no value"),
    "sequence id": (edit(lambda r: param(r, "sequence_id", int64_param=3)), INVALID, "sequence"),
    "shared memory": (edit(lambda r: r.inputs[0].parameters["shared_memory_region"].CopyFrom(
        pb.InferParameter(string_param="r"))), INVALID, "shared memory"),
    "unknown output": (edit(lambda r: r.outputs.add(name="q")), INVALID, "unknown output 'q'"),
    "output twice": (edit(lambda r: (r.outputs.add(name="y"), r.outputs.add(name="y"))), INVALID, "more than once"),
    "negative classes": (edit(lambda r: r.outputs.add(name="y").parameters["classification"].CopyFrom(
        pb.InferParameter(int64_param=-2))), INVALID, "classification"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bad_infer_requests_get_a_status_naming_the_problem(stub, case):
    build, code, text = HOSTILE[case]
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(build())
    assert e.value.code() == code, e.value.details()
    assert text in e.value.details() and "Traceback" not in e.value.details()


def test_a_message_refused_before_it_is_parsed_counts_as_a_failure_of_the_model_it_names(channel, stub):
    """As an HTTP body refused while decoded counts on the model of its URL (found by a
    differential fuzz of gRPC against HTTP: the statistics and /metrics left these out)."""
    def failures():
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="affine")).model_stats[0]
        return stats.inference_stats.fail.count

    raw = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    before = failures()
    whole = good().SerializeToString()
    with pytest.raises(grpc.RpcError) as e:
        raw(whole[:-5])  # the last raw_input_contents cut short: not protobuf wire data
    assert e.value.code() == INVALID, e.value.details()
    assert failures() == before + 1
    with pytest.raises(grpc.RpcError) as e:  # names no model that is served: counted nowhere
        raw(pb.ModelInferRequest(model_name="nope").SerializeToString() + whole[-5:])
    assert e.value.code() == INVALID and failures() == before + 1


def test_extreme_but_valid_parameters_are_served(stub):
    request = good()
    param(request, "priority", uint64_param=2**64 - 1)  # out of range: the default level
    param(request, "timeout", uint64_param=2**64 - 1)  # a deadline far away
    param(request, "custom", string_param="ignored")
    response = stub.ModelInfer(request)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int64), [2] * 6)


def with_parameters(total: int) -> pb.ModelInferRequest:
    """good() holding `total` parameters entries: one in an input's map, one in a requested
    output's, the rest in the request's own."""
    request = good()
    request.inputs[0].parameters["note"].string_param = "an input's"
    request.outputs.add(name="s").parameters["note"].bool_param = True
    for k in range(total - 2):
        request.parameters[f"p{k}"].int64_param = k
    return request


def test_parameters_entries_over_their_bound_are_refused_before_the_message_is_parsed(stub):
    """At most MAX_PARAMETERS entries, the request's, its inputs' and its outputs' maps together,
    counted on the wire before protobuf parses them (a map of 344,000, which the memory budget
    alone let through, took 136-161 ms of CPU to parse): one over is refused naming `parameters`
    and the bound, one at it served, by ModelInfer and by ModelStreamInfer alike."""
    refusal = f"more than {MAX_PARAMETERS:,} parameters entries"
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(with_parameters(MAX_PARAMETERS + 1), timeout=60)
    assert e.value.code() == INVALID and refusal in e.value.details()
    twice = [2] * 6  # the output s: idx * 2
    served = stub.ModelInfer(with_parameters(MAX_PARAMETERS), timeout=60)
    np.testing.assert_array_equal(np.frombuffer(served.raw_output_contents[0], np.int64), twice)
    over, at = stub.ModelStreamInfer(iter([with_parameters(MAX_PARAMETERS + 1), with_parameters(MAX_PARAMETERS)]),
                                     timeout=60)
    assert refusal in over.error_message and not at.error_message
    np.testing.assert_array_equal(np.frombuffer(at.infer_response.raw_output_contents[0], np.int64), twice)


def test_a_message_of_more_fields_than_the_scan_walks_is_refused_before_it_is_parsed(channel):
    """A message of millions of tiny repeated fields (empty inputs) took protobuf's parse 105-126
    ms on the event loop: past MAX_FIELDS fields it is refused, naming the bound and what a
    request needs, by ModelInfer and by ModelStreamInfer alike; the server serves on."""
    tiny = good().SerializeToString() + b"\x2a\x00" * MAX_FIELDS  # with good()'s own fields, over the bound
    refusal = f"request message holds more than {MAX_FIELDS:,} protobuf fields (nested ones included)"
    raw = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        raw(tiny, timeout=60)
    assert e.value.code() == INVALID and e.value.details().startswith(refusal), e.value.details()
    assert "send tensors in raw_input_contents" in e.value.details()
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None,
                                   response_deserializer=pb.ModelStreamInferResponse.FromString)
    over, served = stream(iter([tiny, good().SerializeToString()]), timeout=60)
    assert over.error_message.startswith(refusal) and not served.error_message
    assert len(pbg.GRPCInferenceServiceStub(channel).ModelInfer(good()).raw_output_contents) == 2


NOT_UTF8_ID = b"\x1a\x01\xff"  # an id protobuf's parse refuses: a message with it refused otherwise was not parsed


def test_an_input_of_more_packed_values_than_decoding_takes_is_refused_before_the_message_is_parsed(channel, stub):
    """8 MB of 1-byte shape values were parsed on the event loop (0.24 s each: /v2/health/live took
    3 s for 4 at once) to be refused once decoded: the scan counts them, and a shape of more than
    64 dimensions, or typed contents of many more elements than their shape needs, is refused in
    decoding's words before protobuf runs, by ModelInfer and ModelStreamInfer alike, counted as
    a failure of its model. Each message here also has an id that is not UTF-8, which protobuf's
    parse would have refused instead."""
    long_shape = good()
    long_shape.inputs[0].ClearField("shape")
    long_shape.inputs[0].shape.extend([1] * 100_000)
    many = good()
    typed(many)
    many.inputs[1].contents.int64_contents.extend([1] * 20_000)
    refusals = {"input 'x': shape has 100,000 dimensions; the model's [-1, 8] has 2": long_shape,
                "input 'idx': contents.int64_contents has 20006 elements but shape [2, 3] needs 6": many}
    raw = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None,
                                   response_deserializer=pb.ModelStreamInferResponse.FromString)
    failed = stub.ModelStatistics(pb.ModelStatisticsRequest(name="affine")).model_stats[0].inference_stats.fail.count
    for refusal, request in refusals.items():
        message = request.SerializeToString() + NOT_UTF8_ID
        with pytest.raises(grpc.RpcError) as e:
            raw(message, timeout=60)
        assert (e.value.code(), e.value.details()) == (INVALID, refusal)
        answer, = stream(iter([message]), timeout=60)
        assert answer.error_message == refusal
    with pytest.raises(grpc.RpcError) as e:  # (what the parse says of such an id)
        raw(good().SerializeToString() + NOT_UTF8_ID, timeout=60)
    assert e.value.details().startswith("request message is not a valid ModelInferRequest")
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="affine")).model_stats[0]
    assert stats.inference_stats.fail.count == failed + 2 * len(refusals) + 1


@pytest.fixture(scope="module")
def image_batch_stub(tmp_path_factory):
    """A server of `pictures`: grey 8x8 pictures in, batch sizes 1 and 2,048 (the largest ATC
    recommends), and as many pictures decoded at once."""
    root = tmp_path_factory.mktemp("grpc_image_batch")
    compile_cpu_om(conv_onnx(root / "conv.onnx", channels=1, side=8), root / "pictures.om", batch="1,2048")
    (root / "pictures.yaml").write_text("inputs:\n  x:\n    image: {}\n")
    config = server_config(root, grpc_port=free_port(), model_control_mode="none",
                           images={"max_pending": 2048, "workers": 2})
    with ServerThread(config) as srv:
        with grpc.insecure_channel(f"127.0.0.1:{srv.config.grpc_port}") as channel:
            yield pbg.GRPCInferenceServiceStub(channel)


def picture_batch(parameters: int) -> pb.ModelInferRequest:
    """2,048 pictures in bytes_contents, one field each, and `parameters` entries: 2,054 + that many fields."""
    request = pb.ModelInferRequest(model_name="pictures")  # 1 field
    picture = encode(np.arange(64, dtype=np.uint8).reshape(8, 8))
    request.inputs.add(name="x", datatype="BYTES", shape=[2048],  # 5 fields: the input, name, datatype, shape, contents
                       contents=pb.InferTensorContents(bytes_contents=[picture] * 2048))
    for k in range(parameters):
        request.parameters[f"p{k}"].bool_param = True
    return request


def test_the_largest_picture_batch_in_bytes_contents_is_served_within_the_field_bound(image_batch_stub):
    """A KServe client sends a BYTES input's pictures in contents.bytes_contents, a field each:
    2,048 of them, with parameters up to MAX_FIELDS fields in all, are served; one field more is
    refused (it was charged its worst and parsed)."""
    at_bound = MAX_FIELDS - 2054
    response = image_batch_stub.ModelInfer(picture_batch(at_bound), timeout=120)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).size == 2048 * 4 * 8 * 8
    with pytest.raises(grpc.RpcError) as e:
        image_batch_stub.ModelInfer(picture_batch(at_bound + 1), timeout=120)
    assert e.value.code() == INVALID and f"more than {MAX_FIELDS:,} protobuf fields" in e.value.details()


def test_oversize_message_and_other_rpcs(stub):
    huge = good()
    huge.raw_input_contents[0] = b"\0" * (2 << 20)  # over max_body_bytes (1 MiB in tests)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(huge)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    calls = [
        # (as Triton: a version that is not a number is a bad argument, not an unknown version)
        (stub.ModelMetadata, pb.ModelMetadataRequest(name="affine", version="x"), INVALID,
         "version must be a positive integer, got 'x'"),
        (stub.ModelReady, pb.ModelReadyRequest(name="affine", version="x"), INVALID, "positive integer"),
        (stub.ModelReady, pb.ModelReadyRequest(name="affine", version="0"), INVALID, "positive integer"),
        (stub.ModelMetadata, pb.ModelMetadataRequest(name="affine", version="7"), NOT_FOUND, "no version 7"),
        (stub.ModelConfig, pb.ModelConfigRequest(name=""), INVALID, "model name must not be empty"),
        (stub.ModelStatistics, pb.ModelStatisticsRequest(name="nope"), NOT_FOUND, "unknown model"),
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="affine"), INVALID,
         "model_control_mode is none"),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=""), INVALID, "model name"),
        (stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest(), grpc.StatusCode.UNIMPLEMENTED, ""),
    ]
    for method, request, code, text in calls:
        with pytest.raises(grpc.RpcError) as e:
            method(request)
        assert e.value.code() == code and text in e.value.details(), (method, e.value.details())
    load = pb.RepositoryModelLoadRequest(model_name="affine")
    load.parameters["config"].CopyFrom(pb.ModelRepositoryParameter(string_param="{}"))
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelLoad(load)
    assert e.value.code() == INVALID and "config override" in e.value.details()
    load.parameters["config"].CopyFrom(pb.ModelRepositoryParameter())  # no value: none, as HTTP's null
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelLoad(load)
    assert e.value.code() == INVALID and "model_control_mode is none" in e.value.details()
    unload = pb.RepositoryModelUnloadRequest(model_name="affine")
    unload.parameters["unload_dependents"].CopyFrom(pb.ModelRepositoryParameter(string_param="yes"))
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelUnload(unload)
    assert e.value.code() == INVALID and "unload_dependents must be a bool_param" in e.value.details()
    # ModelReady of a model or version nobody knows: false, not NOT_FOUND (as Triton answers)
    assert stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="affine", version="9")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="affine")).ready is True
    # after all of that the server still serves
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert len(stub.ModelInfer(good()).raw_output_contents) == 2


def test_shutdown_drains_grpc_requests(models_dir, tmp_path, make_config):
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    # a partial batch (3 rows) waits 3 s for more: a request in flight without any test double
    (tmp_path / "affine.yaml").write_text("batching: {max_queue_delay_ms: 3000}\n")
    config = make_config(tmp_path)
    three = pb.ModelInferRequest(model_name="affine")
    three.inputs.add(name="x", datatype="FP32", shape=[3, 8])
    three.inputs.add(name="idx", datatype="INT64", shape=[3, 3])
    three.raw_input_contents.extend([np.ones((3, 8), np.float32).tobytes(), np.ones((3, 3), np.int64).tobytes()])

    async def scenario():
        runner, state, _, _, _ = await started_app(config)
        server = GrpcServer(state, config.max_body_bytes)
        port = await server.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                client = pbg.GRPCInferenceServiceStub(channel)
                inflight = asyncio.ensure_future(client.ModelInfer(three))
                while state.infer_requests.count == 0:
                    assert not inflight.done()
                    await asyncio.sleep(0.005)
                state.stop_accepting()
                assert not (await client.ServerReady(pb.ServerReadyRequest())).ready
                assert not (await client.ServerLive(pb.ServerLiveRequest())).live  # as /v2/health/live's 503
                assert not (await client.ModelReady(pb.ModelReadyRequest(name="affine"))).ready
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await client.ModelInfer(three)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in e.value.details()
                await state.begin_shutdown()  # returns once the queued request is answered
                response = await inflight
                await server.stop(time.monotonic() + config.shutdown_timeout_s)
        finally:
            await server.stop()
            await runner.cleanup()
        return response

    response = asyncio.run(scenario())
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int64), [2] * 9)


def test_serve_refuses_a_taken_grpc_port_with_one_line(models_dir, tmp_path, capsys):
    import socket

    from aclserve.cli import main
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--models", str(tmp_path), "--port", "0", "--grpc-port", str(port),
                     "--device", "cpu", "--model-control-mode", "none", "--log-level", "error"])
    err = capsys.readouterr().err
    assert code == 2 and f"gRPC cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
