"""Review 6: an adversarial pass over the HTTP and gRPC servers by a tester who was not briefed.
Real servers on real ports, raw sockets, aiohttp and grpc clients; waits are hang guards or
lower bounds the test sets itself, never a speed check."""
import asyncio
import json
import logging

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.serving import ServerThread, free_port, request, server_config

from .hostile import open_raw, read_response

TOKEN = "review6-token-0123456789"


@pytest.fixture(scope="module")
def srv(models_dir):
    with ServerThread(server_config(models_dir, body_timeout_s=0.5)) as server:
        yield server


def double_doc(**parameters) -> dict:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
    if parameters:
        doc["parameters"] = parameters
    return doc


def raw_post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    """A keep-alive POST (the connection guard may answer it itself: direct.py), naming a loopback
    Host (a control route of a server without a token refuses others, as a web page's)."""
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), len(body), extra)) + body


async def one_answer(url: str, *pieces: bytes, pause_s: float = 0.0) -> tuple[int, bytes]:
    """Send `pieces` on a new connection (`pause_s` between them), read one answer."""
    reader, writer = await open_raw(url)
    try:
        for i, piece in enumerate(pieces):
            if i and pause_s:
                await asyncio.sleep(pause_s)
            writer.write(piece)
            await writer.drain()
        return await read_response(reader, 15)
    finally:
        writer.close()


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value", ["\u00b2", "\u2460", "\u00b9\u00b2", "9" * 5000],
                         ids=["superscript-two", "circled-one", "superscripts", "5000-digits"])
@pytest.mark.parametrize("route", ["aiohttp", "direct"])
def test_a_unicode_digit_string_as_priority_or_timeout_is_400(srv, key, value, route):
    """`"priority": "²"`: str.isdigit() is True for superscripts and circled digits, which
    int() refuses, so codec._uint_param raised ValueError: 500 "internal error" (and a traceback
    in the log) on both the aiohttp path and the guard's direct answers. The same for a string
    of more than 4,300 digits (int()'s limit; 4,000 digits were already a 400)."""
    body = json.dumps(double_doc(**{key: value})).encode()
    if route == "aiohttp":
        status, _, answer = request(srv, "POST", "/v2/models/double/infer", data=body,
                                    headers={"Connection": "close"})
    else:
        status, answer = asyncio.run(one_answer(srv.url, raw_post("/v2/models/double/infer", body)))
    assert status == 400, answer[:300]
    assert f"parameters.{key}".encode() in answer


def test_a_trace_setting_body_sent_in_two_pieces_is_read_whole(server):
    """POST /v2/trace/setting read its body with one `content.read(64 KiB + 1)`, which returns
    what has arrived so far: a valid body whose second half came a moment after its first was
    refused 400 "not valid JSON" (or, cut at the right place, applied in part). The server's
    body_timeout_s is the default 60 s: on `srv`'s 0.5 s, a loaded machine that stalled the
    client 0.2 s more than its pause had the body timed out (408)."""
    body = json.dumps({"trace_rate": "7", "trace_count": "-1"}).encode()
    head = raw_post("/v2/trace/setting", body)[:-len(body)]
    status, answer = asyncio.run(one_answer(server.url, head + body[:5], body[5:], pause_s=0.3))
    assert status == 200, answer[:300]
    assert b'"trace_rate":"7"' in answer
    request(server, "POST", "/v2/trace/setting", json={"trace_rate": "1000"})


def test_a_trace_setting_body_that_never_comes_is_timed_out(srv):
    """A client that sends the head of POST /v2/trace/setting and none of its body held the
    handler (and its connection, which the guard leaves alone while a handler runs) for ever:
    no body_timeout_s there. Now 408 after body_timeout_s (0.5 s here; 15 s is the hang guard)."""
    head = raw_post("/v2/trace/setting", b"x" * 40)[:-40]
    status, answer = asyncio.run(one_answer(srv.url, head))
    assert status == 408, answer[:300]


def test_grpc_trace_setting_of_a_model_needs_the_token_as_http_does(models_dir):
    """With auth_inference, HTTP refuses /v2/models/{model}/trace/setting without the token
    (401), but the gRPC TraceSetting RPC checked nothing: anyone could turn on tracing of every
    request of a model (and name the file it is written to)."""
    config = server_config(models_dir, grpc_port=free_port(), api_token=TOKEN, auth_inference=True)
    with ServerThread(config) as server:
        status, _, _ = request(server, "POST", "/v2/models/double/trace/setting", json={"trace_rate": "1"})
        assert status == 401
        change = pb.TraceSettingRequest(model_name="double")
        change.settings["trace_rate"].value.append("1")
        with grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}") as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.TraceSetting(change, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            granted = stub.TraceSetting(change, timeout=30, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert list(granted.settings["trace_rate"].value) == ["1"]


def test_a_refused_requests_error_in_the_request_log_cannot_forge_a_line(models_dir, caplog):
    """observe.request_id replaces unprintable characters in request ids so that a newline
    cannot forge a text log line, but the request log's `error` field is the refusal's message,
    which quotes the client's own names as they were sent: an input named "x\\n<a line>" put
    that line in the log as if the server had written it."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    forged = "x\nINFO aclserve.requests: infer model=double status=200"
    body = {"inputs": [{"name": forged, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
    with ServerThread(server_config(models_dir, request_log=True)) as server:
        status, _, answer = request(server, "POST", "/v2/models/double/infer", json=body)
    assert status == 400, answer
    [line] = [r for r in caplog.records if r.name == "aclserve.requests"]
    assert line.getMessage().isprintable(), line.getMessage()
    assert line.fields["error"].startswith("unknown input 'x?INFO aclserve.requests")


WIDE = 1 << 18  # output elements per row of the `wide` model


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory):
    """`wide`: x FP32 [N, 16] -> y FP32 [N, 16 * 16384] (x tiled): a 1 MiB answer per row, the
    size of a segmentation map or a large embedding."""
    from onnx import TensorProto, helper, numpy_helper
    from tests.tiny_models import compile_cpu_om, save_graph
    src, root = tmp_path_factory.mktemp("wide_src"), tmp_path_factory.mktemp("wide_models")
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["y"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDE])],
        [numpy_helper.from_array(np.array([1, WIDE // 16], np.int64), "repeats")])
    compile_cpu_om(save_graph(graph, src / "wide.onnx"), root / "wide.om", batch="1,2")
    with ServerThread(server_config(root, grpc_port=free_port())) as server:
        yield server


def wide_doc(classes: int, rows: int = 2) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 16], "data": [0.5] * (16 * rows)}],
            "outputs": [{"name": "y", "parameters": {"classification": classes}}]}


def test_classification_of_a_wide_output_is_bounded(wide_server):
    """`classification: 1000000000` on an output of 2 x 262,144 values made 524,288 Python
    strings on the event loop: a second or more during which the server answered nobody
    (health checks included), and about 100 MB held outside the memory budget, chosen by the
    client with one number. Refused now, naming the limit; a top-5 of the same output is served."""
    status, _, answer = request(wide_server, "POST", "/v2/models/wide/infer", json=wide_doc(10**9))
    assert status == 400, answer[:300]
    assert b"classification" in answer
    status, _, answer = request(wide_server, "POST", "/v2/models/wide/infer", json=wide_doc(5))
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"][0]["shape"] == [2, 5]


def test_grpc_classification_of_a_wide_output_is_bounded(wide_server):
    """The same over gRPC (its own codec reads the classification parameter)."""
    msg = pb.ModelInferRequest(model_name="wide")
    msg.inputs.add(name="x", datatype="FP32", shape=[2, 16])
    msg.raw_input_contents.append(np.full((2, 16), 0.5, np.float32).tobytes())
    msg.outputs.add(name="y").parameters["classification"].int64_param = 10**9
    with grpc.insecure_channel(f"127.0.0.1:{wide_server.config.grpc_port}") as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(msg, timeout=120)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "classification" in refused.value.details()


@pytest.mark.parametrize("value", ["+5", "1_0", "-0", "\u0663", " 5x", "9" * 30],
                         ids=["plus", "underscore", "minus-zero", "arabic-indic-digit", "trailing-junk", "30-digits"])
@pytest.mark.parametrize("route", ["aiohttp", "direct"])
def test_an_inference_header_length_that_is_not_plain_digits_is_400(srv, value, route):
    """Found in review 6, fixed after it: int() read "+5", "1_0" and Unicode digits, and "-0"
    as 0, which switches the body to raw binary. Only ASCII digits are a length."""
    body = json.dumps(double_doc()).encode()
    header = "Inference-Header-Content-Length"
    if route == "aiohttp":
        status, _, answer = request(srv, "POST", "/v2/models/double/infer", data=body,
                                    headers={"Connection": "close", header: value})
    else:
        extra = b"%s: %s\r\n" % (header.encode(), value.encode())
        status, answer = asyncio.run(one_answer(srv.url, raw_post("/v2/models/double/infer", body, extra)))
    assert status == 400, answer[:300]
    assert header.encode() in answer
