"""Work on the event loop stays bounded whatever a request holds: each guard below is checked by
what it answers or by how many steps of Python it takes (counted, never timed)."""
import json
import shutil
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from aclserve.errors import InvalidInput
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec, grpc_codec, json_limits, json_simd, json_tensors, redact
from aclserve.server.bytes_codec import MAX_QUOTED_DIMS, check_rows
from aclserve.server.grpc_control import CONTROL_MESSAGE_BYTES
from aclserve.trace.settings import MAX_LEVELS, TraceSettingsError, parse_changes

from tests.serving import ServerThread, free_port, server_config

SIG = codec.Signature([TensorSpec("x", "FP32", np.dtype(np.float32), (-1, 4))],
                      [TensorSpec("y", "FP32", np.dtype(np.float32), (-1, 2))], 8)
X = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}


def counting(monkeypatch, module, name):
    calls = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


# -- json_simd: the scan for nested `data` arrays ----------------------------------------------

def python_lines(fn, *args) -> int:
    """Lines of Python run inside `fn`'s own module while it runs (its steps, never its time)."""
    import sys
    module_file, lines = fn.__code__.co_filename, [0]

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != module_file:
            return None
        if event == "line":
            lines[0] += 1
        return tracer
    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return lines[0]


def test_whitespace_after_a_data_key_is_skipped_whole():
    text = b'{"data"' + b" \t\r\n" * 100_000 + b': \n [1, 2]}'
    assert json_simd._skip_space(text, 7) == text.index(b":")
    assert python_lines(json_simd._skip_space, text, 7) < 10  # a byte at a time: 400,000 steps
    assert json_simd._data_arrays_flat(text)
    assert not json_simd._data_arrays_flat(b'{"data"' + b" " * 100_000 + b':[[1]]}')


def test_data_strings_are_looked_at_up_to_a_limit(monkeypatch):
    skips = counting(monkeypatch, json_simd, "_skip_space")
    many = b'{"x":' + b'"data"' * 100_000 + b"}"
    assert not json_simd._data_arrays_flat(many)  # left to orjson, which refuses it
    assert skips[0] <= 2 * json_simd.MAX_DATA_KEYS
    with pytest.raises(InvalidInput, match="not valid JSON"):
        codec.decode_request(many, None, SIG)
    few = json.dumps({"inputs": [X], "p": [{"data": [i]} for i in range(json_simd.MAX_DATA_KEYS - 1)]}).encode()
    assert json_simd._data_arrays_flat(few)


# -- the path redactor ---------------------------------------------------------------------------

def test_long_messages_are_cut_before_paths_are_looked_for(monkeypatch):
    replaced = counting(monkeypatch, redact.PathRedactor, "_replace")
    shown = redact.PathRedactor("/srv/models")("unknown input '" + "/a/b " * 1_000_000 + "'")
    assert len(shown) < redact.MAX_TEXT + 50 and shown.endswith("more characters)")
    assert replaced[0] <= redact.MAX_TEXT // 5 + 1
    assert redact.PathRedactor("/srv/models")("in /srv/models/a/1/model.om") == "in <models>/a/1/model.om"


# -- shapes of many dimensions ---------------------------------------------------------------------

def test_a_long_shape_is_refused_by_its_length():
    body = json.dumps({"inputs": [{**X, "shape": [1] * 100_000}]}).encode()
    with pytest.raises(InvalidInput) as e:
        codec.decode_request(body, None, SIG)
    assert e.value.message == "input 'x': shape has 100,000 dimensions; the model's [-1, 4] has 2"
    body = json.dumps({"inputs": [{**X, "shape": [1, 2, 2]}]}).encode()  # a short one is quoted as before
    with pytest.raises(InvalidInput, match=r"shape \[1, 2, 2\] does not match the model's \[-1, 4\]"):
        codec.decode_request(body, None, SIG)


def test_a_long_bytes_shape_is_named_by_its_length():
    spec = TensorSpec("img", "BYTES", np.dtype(object), (-1, 1))
    with pytest.raises(InvalidInput) as e:
        check_rows("img", [1] * 100_000, spec, 8, None)
    assert e.value.message.endswith("got 100,000 dimensions")
    with pytest.raises(InvalidInput, match=r"got \[1, 2\]"):
        check_rows("img", [1, 2], spec, 8, None)


def test_a_long_grpc_shape_is_refused_before_it_is_listed():
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1] * (MAX_QUOTED_DIMS + 1))
    request.raw_input_contents.append(b"\0" * 16)
    with pytest.raises(InvalidInput, match=f"shape has {MAX_QUOTED_DIMS + 1} dimensions"):
        grpc_codec.decode_infer_request(request, SIG)


# -- gRPC: inputs beyond those decoding reads ------------------------------------------------------

def test_contents_are_counted_in_the_inputs_decoding_reads():
    request = pb.ModelInferRequest(model_name="m")
    for i in range(1000):
        request.inputs.add(name=f"in{i}").contents.fp32_contents.extend([1.0] * 3)
    assert grpc_codec.contents_elements(request, SIG) == 2 * 3  # the model's one input, and one more
    with pytest.raises(InvalidInput, match="unknown input 'in0'"):
        grpc_codec.decode_infer_request(request, SIG)


# -- booleans among numbers ----------------------------------------------------------------------

def test_booleans_elsewhere_are_counted_within_a_budget(monkeypatch):
    walked = counting(monkeypatch, json_tensors, "_count_bools")
    assert json_tensors._count_bools([[]] * 100_000, budget=json_tensors.ELSEWHERE_VALUES) is None
    junk = [[]] * 100_000
    walked[0] = 0
    codec.decode_request(json.dumps({"inputs": [X], "junk": junk, "flag": True}).encode(), None, SIG)
    with pytest.raises(InvalidInput, match="not true/false"):
        codec.decode_request(json.dumps({"inputs": [{**X, "data": [1.0, True, 3.0, 4.0]}], "junk": junk,
                                         "flag": True}).encode(), None, SIG)
    assert walked[0] == 2 * 2  # each request: the budgeted count elsewhere, then its data
    counts = json_tensors._count_bools([[True, 1], {"a": [False, []]}], budget=100)
    assert counts == 2


# -- control RPCs ----------------------------------------------------------------------------------

def test_trace_levels_are_refused_past_a_handful():
    with pytest.raises(TraceSettingsError, match="got 1,000 values"):
        parse_changes({"trace_level": ["OFF"] * 1000})
    assert parse_changes({"trace_level": ["OFF"] * MAX_LEVELS}) == {"level": "OFF"}


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loop_stalls")
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    config = server_config(root, grpc_port=free_port(), model_control_mode="none", max_body_bytes=4 << 20,
                           grpc_max_message_bytes=4 << 20)
    with ServerThread(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.config.grpc_port}",
                               options=[("grpc.max_send_message_length", 16 << 20)]) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def test_control_messages_are_refused_past_their_limit(stub):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="/ " * CONTROL_MESSAGE_BYTES))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"over the {CONTROL_MESSAGE_BYTES:,} this method takes" in e.value.details()
    assert stub.ModelMetadata(pb.ModelMetadataRequest(name="affine")).name == "affine"


def test_an_unknown_trace_setting_among_many_is_named(stub, monkeypatch):
    from aclserve.server import views
    read, trace_settings = [], views.trace_settings
    monkeypatch.setattr(views, "trace_settings", lambda state, model, changes: (
        read.append(len(changes or {})), trace_settings(state, model, changes))[1])
    request = pb.TraceSettingRequest()
    for i in range(20_000):
        request.settings[f"s{i}"].value.append("1")
    with pytest.raises(grpc.RpcError) as e:
        stub.TraceSetting(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("unknown trace setting 's")
    assert read and max(read) <= 8  # settings read: at most one more than there are (7), not 20,000


def quoted_cut(name: str) -> str:
    return f"'{name[:256]}'... ({len(name) - 256:,} more characters)"


def test_a_long_name_is_quoted_cut(stub):
    """Cut to fit grpc's metadata: at 8,192 characters the status went over grpc's 8 KB soft
    limit, past which a client gets RESOURCE_EXHAUSTED "Stream removed" at random (one CI run in
    a few); so every try must come back as the status. The name is cut, not the message: the
    model's names after it stay, and the count is the name's (the message cut whole ended
    "... (4,187 more characters)" for a 10,000-character name). (An input's name: a model's
    longer than any model's is refused unquoted.)"""
    for name in ("/ " * 100_000, "é" * 50_000, "%" * 50_000, "x" * 10_000):
        request = pb.ModelInferRequest(model_name="affine", inputs=[
            pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=[1, 4])])
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(request)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()[:200]
            assert e.value.details() == f"unknown input {quoted_cut(name)} (model inputs: 'x', 'idx')"
    request = affine_request(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y" * 10_000)])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request)
    assert e.value.details() == f"unknown output {quoted_cut('y' * 10_000)} (model outputs: 'y', 's')"


def affine_request(**fields) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="affine", raw_input_contents=[np.ones((1, 8), np.float32).tobytes(),
                                np.ones((1, 3), np.int64).tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 8]),
        pb.ModelInferRequest.InferInputTensor(name="idx", datatype="INT64", shape=[1, 3])], **fields)


def test_a_long_name_is_quoted_cut_over_http_as_over_grpc(server):
    def refusal(body) -> str:
        request = urllib.request.Request(f"http://{server.url}/v2/models/affine/infer", json.dumps(body).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=30)
        return json.loads(e.value.read())["error"]
    x = {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}
    idx = {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}
    assert refusal({"inputs": [dict(x, name="x" * 10_000)]}) == \
        f"unknown input {quoted_cut('x' * 10_000)} (model inputs: 'x', 'idx')"
    assert refusal({"inputs": [x, idx], "outputs": [{"name": "y" * 10_000}]}) == \
        f"unknown output {quoted_cut('y' * 10_000)} (model outputs: 'y', 's')"


def test_a_request_of_more_object_keys_than_any_needs_is_refused_before_it_is_parsed(server):
    """800,000 distinct keys in `parameters` (15 MB, within max_json_bytes and max_json_elements)
    held the event loop 0.7 s while they were parsed, and the request was answered 200 (a tester,
    t44): the keys are bounded by the text's colons first. Here 16,385 keys, within this server's
    max_json_bytes (768 KiB) and max_json_elements too."""
    def answer(keys: int) -> tuple[int, dict]:
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                      {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}],
                           "parameters": {f"{i:x}": 0 for i in range(keys)}}, separators=(",", ":")).encode()
        request = urllib.request.Request(f"http://{server.url}/v2/models/affine/infer", body)
        try:
            with urllib.request.urlopen(request, timeout=60) as ok:
                return ok.status, json.loads(ok.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    status, doc = answer(json_limits.MAX_JSON_KEYS + 1)
    assert status == 400 and doc["error"] == (
        "the JSON part of the request holds more than 16,384 object keys (counted by its ':' characters, those in "
        "strings too); a request needs a few an input")
    assert answer(json_limits.MAX_JSON_KEYS - 16)[0] == 200


def test_colons_are_counted_only_in_a_text_that_could_hold_too_many_keys():
    """A short text cannot hold too many keys; a long one is refused by its colons, those in
    strings too, found one by one while they are few, then counted (a binary request's JSON part,
    a view of its body, counted at once)."""
    def body(colons: int, pad: int = json_limits.KEYS_FROM_BYTES) -> bytes:
        return json.dumps({"inputs": [X], "note": ":" * colons, "pad": "x" * pad}).encode()
    assert codec.decode_request(body(json_limits.KEYS_FROM_BYTES - 200, 0), None, SIG).rows == 1
    assert codec.decode_request(body(json_limits.MAX_JSON_KEYS - 7), None, SIG).rows == 1  # and its 7 keys
    with pytest.raises(InvalidInput, match="more than 16,384 object keys"):
        codec.decode_request(body(json_limits.MAX_JSON_KEYS - 6), None, SIG)
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "parameters": {"binary_data_size": 16}}], "note": ":" * 20_000,
                       "pad": "x" * json_limits.KEYS_FROM_BYTES}).encode()
    with pytest.raises(InvalidInput, match="more than 16,384 object keys"):
        codec.decode_request(head + bytes(16), len(head), SIG)


def test_a_status_message_fits_grpc_metadata_once_percent_encoded():
    from aclserve.server.grpc_status import STATUS_MESSAGE_BYTES, fit_status_message
    assert fit_status_message("unknown model 'x'") == "unknown model 'x'"
    assert fit_status_message("a" * STATUS_MESSAGE_BYTES) == "a" * STATUS_MESSAGE_BYTES
    for text, cost in (("a" * 10_000, 1), ("%" * 10_000, 3), ("é" * 10_000, 6), ("\n" * 10_000, 3)):
        cut = fit_status_message(text)
        kept = cut.index("...")
        assert cut.endswith(f"... ({10_000 - kept:,} more characters)")
        assert STATUS_MESSAGE_BYTES - 64 - cost < kept * cost <= STATUS_MESSAGE_BYTES - 64
