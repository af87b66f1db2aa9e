"""Pure codec tests: request decoding/validation and response encoding, no network."""
import json

import numpy as np
import pytest

from aclserve.errors import InvalidInput
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec, encode


def spec(name, datatype, shape):
    from aclserve.dtypes import kserve_to_numpy
    return TensorSpec(name, datatype, kserve_to_numpy(datatype), tuple(shape))


BATCHED = codec.Signature([spec("x", "FP32", [-1, 4])], [spec("y", "FP32", [-1, 2]), spec("z", "INT64", [-1])], 8)
TWO_INPUTS = codec.Signature([spec("a", "FP32", [-1, 2]), spec("b", "INT32", [-1, 3])],
                             [spec("y", "FP32", [-1, 2])], 4)
STATIC = codec.Signature([spec("x", "FP16", [2, 2])], [spec("y", "FP16", [2])], 0)
BOOLS = codec.Signature([spec("m", "BOOL", [3])], [spec("o", "BOOL", [3])], 0)


def body(doc, *chunks):
    head = json.dumps(doc).encode()
    return head + b"".join(chunks), (len(head) if chunks else None)


def decode(sig, doc, *chunks, header=None):
    raw, length = body(doc, *chunks)
    return codec.decode_request(raw, length if header is None else header, sig)


def inp(name, datatype, shape, data=None, size=None):
    item = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        item["data"] = data
    if size is not None:
        item["parameters"] = {"binary_data_size": size}
    return item


def bad(sig, doc, *chunks, match, header=None):
    with pytest.raises(InvalidInput, match=match):
        decode(sig, doc, *chunks, header=header)


def test_json_flat_and_nested_data():
    flat = decode(BATCHED, {"inputs": [inp("x", "FP32", [2, 4], list(range(8)))]})
    nested = decode(BATCHED, {"inputs": [inp("x", "FP32", [2, 4], [[0, 1, 2, 3], [4, 5, 6, 7]])]})
    for req in (flat, nested):
        assert req.rows == 2
        assert req.inputs["x"].dtype == np.float32
        np.testing.assert_array_equal(req.inputs["x"], np.arange(8, dtype=np.float32).reshape(2, 4))


def test_fp16_json_numbers_and_bools():
    req = decode(STATIC, {"inputs": [inp("x", "FP16", [2, 2], [0.5, 1.5, 2.0, -1.0])]})
    assert req.inputs["x"].dtype == np.float16 and req.rows == 1
    req = decode(BOOLS, {"inputs": [inp("m", "BOOL", [3], [True, False, True])]})
    np.testing.assert_array_equal(req.inputs["m"], [True, False, True])
    bad(BOOLS, {"inputs": [inp("m", "BOOL", [3], [1, 0, 1])]}, match="booleans")


@pytest.mark.parametrize("data", [
    [1.0, True, 2.0, 3.0], [[0, 1, 2, 3], [4, 5, False, 7]], [True, True, True, True],
    [1, 2, 3, True],  # the fast path's first element is a number
])
def test_a_boolean_among_numbers_is_refused(data):
    rows = 2 if type(data[0]) is list else 1
    bad(BATCHED, {"inputs": [inp("x", "FP32", [rows, 4], data)]}, match="input 'x'.*numbers.*true/false")
    bad(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [1.0, 2.0]), inp("b", "INT32", [1, 3], [1, True, 3])]},
        match="input 'b'.*integers.*true/false")


def test_booleans_elsewhere_do_not_make_numbers_suspect():
    doc = {"id": "true false", "parameters": {"flag": True}, "nested": {"x": [False]},
           "inputs": [inp("x", "FP32", [1, 4], [1.0, 1, 0.0, 0])],
           "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}
    req = decode(BATCHED, doc)
    np.testing.assert_array_equal(req.inputs["x"], [[1.0, 1.0, 0.0, 0.0]])
    mixed = codec.Signature([spec("m", "BOOL", [3]), spec("x", "FP32", [2])], [spec("o", "BOOL", [3])], 0)
    req = decode(mixed, {"inputs": [inp("m", "BOOL", [3], [True, False, True]), inp("x", "FP32", [2], [1, 0])]})
    np.testing.assert_array_equal(req.inputs["x"], [1.0, 0.0])
    bad(mixed, {"inputs": [inp("m", "BOOL", [3], [True, False, True]), inp("x", "FP32", [2], [1, False])]},
        match="input 'x'.*true/false")


def test_binary_inputs_in_order_zero_copy():
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.arange(6, dtype=np.int32).reshape(2, 3)
    req = decode(TWO_INPUTS, {"inputs": [inp("a", "FP32", [2, 2], size=16), inp("b", "INT32", [2, 3], size=24)]},
                 a.tobytes(), b.tobytes())
    np.testing.assert_array_equal(req.inputs["a"], a)
    np.testing.assert_array_equal(req.inputs["b"], b)
    assert not req.inputs["a"].flags.writeable  # a view into the body, not a copy


def test_mixed_json_and_binary_inputs():
    b = np.arange(3, dtype=np.int32).reshape(1, 3)
    req = decode(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [1, 2]), inp("b", "INT32", [1, 3], size=12)]},
                 b.tobytes())
    np.testing.assert_array_equal(req.inputs["b"], b)


@pytest.mark.parametrize("chunks,size,match", [
    ([b"\0" * 12], 16, r"needs 16 bytes at offset \d+ but only 12 follow there"),  # body too short
    ([b"\0" * 20], 16, "after the last binary input"),  # trailing bytes
    ([b"\0" * 12], 12, "binary_data_size 12 does not match"),  # size disagrees with shape
])
def test_binary_size_mismatch(chunks, size, match):
    bad(BATCHED, {"inputs": [inp("x", "FP32", [1, 4], size=size)]}, *chunks, match=match)



IMAGES = codec.Signature([TensorSpec("img", "BYTES", np.dtype(object), (-1,))], [spec("y", "FP32", [-1, 2])], 8)


@pytest.mark.parametrize("size,data,chunks,says", [
    (-1, None, [b"\0" * 16], "{input}: binary_data_size must be a non-negative integer"),
    (16, None, [], "{input} has binary_data_size but the request has no Inference-Header-Content-Length header"),
    (16, [0, 0, 0, 0], [b"\0" * 16], "{input} has both data and binary_data_size"),
    (16, None, [b"\0" * 12], "{input}: binary data needs 16 bytes at offset {json} but only 12 follow there "
                              "(the body has {body})"),
])
def test_a_numeric_and_a_bytes_input_are_refused_their_binary_data_size_alike(size, data, chunks, says):
    """codec.py and bytes_codec.py check binary_data_size in one place (binary_data.py): same words."""
    for sig, item in ((BATCHED, inp("x", "FP32", [1, 4], data, size)), (IMAGES, inp("img", "BYTES", [1], data, size))):
        raw, length = body({"inputs": [item]}, *chunks)
        with pytest.raises(InvalidInput) as refused:
            codec.decode_request(raw, length, sig)
        assert refused.value.message == says.format(input=f"input '{item['name']}'", json=length, body=len(raw))

def test_binary_framing_header_errors():
    raw, length = body({"inputs": [inp("x", "FP32", [1, 4], size=16)]}, b"\0" * 16)
    with pytest.raises(InvalidInput, match="only"):
        codec.decode_request(raw, len(raw) + 1, BATCHED)
    with pytest.raises(InvalidInput, match="no Inference-Header-Content-Length"):
        codec.decode_request(raw[:length], None, BATCHED)
    for off in (-3, 5):  # a header a few bytes off names itself (it read as a JSON error alone)
        with pytest.raises(InvalidInput, match=rf"^the JSON part of the body \(its first {length + off} bytes, as "
                                               r"Inference-Header-Content-Length gives\) is not valid JSON: .+; the "
                                               r"header is the JSON's length in bytes, UTF-8 encoded$"):
            codec.decode_request(raw, length + off, BATCHED)
    whole = b'{"inputs": [],}'  # the header right (the whole body), the JSON wrong: no word on the header
    with pytest.raises(InvalidInput, match=r"^request body is not valid JSON: .*(?<!UTF-8 encoded)$"):
        codec.decode_request(whole, len(whole), BATCHED)
    ascii_tail = raw[:length] + b"0" * 16  # the header given the body's length (a second review): named
    with pytest.raises(InvalidInput, match=r"^the JSON part of the body \(its first \d+ bytes, as Inference-"):
        codec.decode_request(ascii_tail, len(ascii_tail), BATCHED)
    with pytest.raises(InvalidInput, match="non-negative integer"):
        codec.parse_header_length(["-4"])
    with pytest.raises(InvalidInput, match="'9{23}' is larger than any body"):  # (it is a non-negative integer)
        codec.parse_header_length(["9" * 23])
    assert codec.parse_header_length(["0" * 20 + "12"]) == 12  # (leading zeros make it no larger)
    tensor = np.full(4, -1.5e38, np.float32).tobytes()  # bytes no UTF-8 text holds
    raw, length = body({"inputs": [inp("x", "FP32", [1, 4], size=16)]}, tensor)
    with pytest.raises(InvalidInput, match="not UTF-8 text .binary tensor data goes after the JSON part, whose "
                                           "length Inference-Header-Content-Length gives"):
        codec.decode_request(raw, None, BATCHED)  # its header forgotten
    assert codec.parse_header_length([]) is None and codec.parse_header_length(["12"]) == 12


def test_json_only_body_with_header_equal_to_body_length():
    raw, _ = body({"inputs": [inp("x", "FP32", [1, 4], [1, 2, 3, 4])]})
    assert codec.decode_request(raw, len(raw), BATCHED).inputs["x"].shape == (1, 4)


def test_binary_bools_are_the_bytes_0_and_1():
    """Any other byte would be a numpy bool that is neither: refused, framed or raw."""
    req = decode(BOOLS, {"inputs": [inp("m", "BOOL", [3], size=3)]}, b"\x01\x00\x01")
    np.testing.assert_array_equal(req.inputs["m"], [True, False, True])
    bad(BOOLS, {"inputs": [inp("m", "BOOL", [3], size=3)]}, b"\x01\x02\x00", match="BOOL elements must be")
    raw = codec.Signature([spec("m", "BOOL", [-1])], [spec("o", "BOOL", [-1])], 0)
    assert codec.decode_request(b"\x00\x01", 0, raw).inputs["m"].tolist() == [False, True]
    with pytest.raises(InvalidInput, match="BOOL elements must be the bytes 0 or 1"):
        codec.decode_request(b"\x00\xff", 0, raw)


@pytest.mark.parametrize("datatype, data", [
    ("INT64", [2**63, 1]), ("INT64", [2**63, -1]), ("UINT64", [2**64, 1]), ("UINT64", [-1, 2**64]),
    ("INT64", [-2**63 - 1, 1]),  # (a float of exactly -2**63 once read: it looked in range, "must be integers")
])
def test_integers_past_64_bits_are_out_of_range_not_non_integers(datatype, data):
    """numpy (int64 and uint64 mixed) or orjson (past 64 bits) makes such integers floats."""
    sig = codec.Signature([spec("x", datatype, [2])], [spec("y", datatype, [2])], 0)
    bad(sig, {"inputs": [inp("x", datatype, [2], data)]}, match=f"data values out of range for {datatype}")
    bad(sig, {"inputs": [inp("x", datatype, [2], [1.5, 1])]}, match="data elements must be integers")


def test_a_missing_datatype_is_named():
    bad(BATCHED, {"inputs": [{"name": "x", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
        match="input 'x': datatype is missing \\(the model expects FP32\\)")


def test_raw_binary_request():
    x = np.arange(4, dtype=np.float32)
    req = codec.decode_request(x.tobytes(), 0, BATCHED)
    assert req.inputs["x"].shape == (1, 4) and req.binary_output and req.rows == 1
    with pytest.raises(InvalidInput, match="does not fit"):
        codec.decode_request(b"\0" * 12, 0, BATCHED)
    with pytest.raises(InvalidInput, match="single-input"):
        codec.decode_request(b"\0" * 8, 0, TWO_INPUTS)


@pytest.mark.parametrize("doc,match", [
    ([1, 2], "JSON object"),
    ({}, "inputs must be a non-empty array"),
    ({"inputs": [inp("q", "FP32", [1, 4], [0] * 4)]}, "unknown input 'q'"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)] * 2}, "more than once"),
    ({"inputs": [inp("x", "FP64", [1, 4], [0] * 4)]}, 'datatype "FP64" does not match'),
    ({"inputs": [inp("x", "BYTES", [1, 4], ["a"] * 4)]}, "BYTES is not supported"),
    ({"inputs": [inp("x", "FP32", [1, 5], [0] * 5)]}, r"shape \[1, 5\] does not match"),
    ({"inputs": [inp("x", "FP32", [4], [0] * 4)]}, "does not match the model's"),
    ({"inputs": [inp("x", "FP32", [0, 4], [])]}, "at least 1"),
    ({"inputs": [inp("x", "FP32", [9, 4], [0] * 36)]}, "exceeds the model's max_batch_size 8"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 3)]}, "has 3 elements but shape"),
    ({"inputs": [inp("x", "FP32", [1, 4], [[0, 1], [2]])]}, "rectangular"),
    ({"inputs": [inp("x", "FP32", [1, 4], ["a", "b", "c", "d"])]}, "must be numbers"),
    ({"inputs": [inp("x", "FP32", [1, 4], [None] * 4)]}, "must be numbers"),
    ({"inputs": [inp("x", "FP32", [1, 4])]}, "neither data"),
    ({"inputs": [inp("x", "FP32", [1, "4"], [0] * 4)]}, "shape must be"),
    ({"inputs": [inp("x", "FP32", [True, 4], [0] * 4)]}, "shape must be"),
    ({"inputs": [inp("x", "FP32", [-1, 4], [0] * 4)]}, "shape must be"),
    ({"inputs": [inp("x", "FP32", "1,4", [0] * 4)]}, "shape must be"),
    ({"inputs": [inp("x", "FP32", [1, 5, "4"], [0] * 4)]}, "shape must be"),
    ({"inputs": [inp("x", "FP32", [1, 4, 1], [0] * 4)]}, r"shape \[1, 4, 1\] does not match"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": {"priority": -1}}, "priority"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": {"priority": 1.5}}, "priority"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": {"timeout": "soon"}}, "timeout"),
    # the protocol's parameter values are strings, numbers and booleans (Triton refuses others)
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": {"foo": [1]}},
     r'parameter "foo" must be a string, number or boolean, got an array of 1 item'),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": {"foo": {"a": 1}}}, "got an object of 1 key"),
    ({"inputs": [dict(inp("x", "FP32", [1, 4], [0] * 4), parameters={"foo": [1, 2]})]},
     r'input \'x\': parameter "foo" must be a string, number or boolean, got an array of 2 items'),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "outputs": [{"name": "y", "parameters": {"foo": {}}}]},
     r'output \'y\': parameter "foo" must be a string, number or boolean, got \{\}'),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "outputs": [{"name": "nope"}]}, "unknown output 'nope'"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "id": 5}, "id must be a string"),
    # a false value of another type was taken for none (a helper's fuzz of the HTTP corners)
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "parameters": 0}, "parameters must be an object"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "outputs": 0}, "outputs must be an array"),
    ({"inputs": [inp("x", "FP32", [1, 4], [0] * 4)], "outputs": ""}, "outputs must be an array"),
    ({"inputs": [dict(inp("x", "FP32", [1, 4], [0] * 4), parameters=[])]}, "parameters must be an object"),
    ({"inputs": [dict(inp("x", "FP32", [1, 4], [0] * 4), parameters={"shared_memory_region": "r"})]},
     "shared memory is not supported"),
])
def test_invalid_requests_name_the_field(doc, match):
    bad(BATCHED, doc, match=match)


def test_missing_input_and_row_mismatch():
    bad(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [0, 0])]}, match="missing input.*b")
    bad(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [0, 0]), inp("b", "INT32", [2, 3], [0] * 6)]},
        match="differs from the other inputs")


def test_integer_inputs_refuse_floats_and_overflow():
    bad(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [0, 0]), inp("b", "INT32", [1, 3], [1.5, 2, 3])]},
        match="integers")
    bad(TWO_INPUTS, {"inputs": [inp("a", "FP32", [1, 2], [0, 0]), inp("b", "INT32", [1, 3], [2**40, 2, 3])]},
        match="out of range")


def test_parameters_and_requested_outputs():
    req = decode(BATCHED, {"id": "r1", "inputs": [inp("x", "FP32", [1, 4], [0] * 4)],
                           "parameters": {"priority": 1, "timeout": 5000, "binary_data_output": True},
                           "outputs": [{"name": "z", "parameters": {"binary_data": False}}]})
    assert (req.id, req.priority, req.timeout_us, req.binary_output) == ("r1", 1, 5000, True)
    assert req.outputs == (codec.RequestedOutput("z", False, 0),)


def run_encode(req, outputs, sig=BATCHED):
    return encode.encode_response("m", "1", req, outputs, sig, batched=sig.max_batch_size > 0)


OUTPUTS = {"y": np.array([[1.5, 2.5]], dtype=np.float32), "z": np.array([7], dtype=np.int64)}


def test_encode_json_response_echoes_id():
    raw, length = run_encode(codec.InferRequest({}, 1, id="abc"), OUTPUTS)
    assert length is None
    doc = json.loads(raw)
    assert doc["id"] == "abc" and doc["model_name"] == "m" and doc["model_version"] == "1"
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]},
                              {"name": "z", "datatype": "INT64", "shape": [1], "data": [7]}]


def test_encode_binary_per_output_override():
    req = codec.InferRequest({}, 1, binary_output=True,
                             outputs=(codec.RequestedOutput("z", None), codec.RequestedOutput("y", False)))
    raw, length = run_encode(req, OUTPUTS)
    doc = json.loads(raw[:length])
    assert [o["name"] for o in doc["outputs"]] == ["z", "y"]
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 8} and "data" not in doc["outputs"][0]
    assert doc["outputs"][1]["data"] == [1.5, 2.5]
    assert np.frombuffer(raw[length:], np.int64).tolist() == [7]


def test_encode_all_binary_round_trip_order():
    req = codec.InferRequest({}, 1, binary_output=True)
    raw, length = run_encode(req, OUTPUTS)
    doc = json.loads(raw[:length])
    offset = length
    for out in doc["outputs"]:
        size = out["parameters"]["binary_data_size"]
        arr = np.frombuffer(raw[offset:offset + size], OUTPUTS[out["name"]].dtype).reshape(out["shape"])
        np.testing.assert_array_equal(arr, OUTPUTS[out["name"]])
        offset += size
    assert offset == len(raw)


def test_classification_top_n():
    req = codec.InferRequest({}, 2, outputs=(codec.RequestedOutput("y", False, 1),))
    outs = {"y": np.array([[0.1, 0.9], [0.7, 0.2]], dtype=np.float32)}
    doc = json.loads(run_encode(req, outs)[0])
    assert doc["outputs"][0]["datatype"] == "BYTES" and doc["outputs"][0]["shape"] == [2, 1]
    assert [s.split(":")[1] for s in doc["outputs"][0]["data"]] == ["1", "0"]
    req = codec.InferRequest({}, 2, outputs=(codec.RequestedOutput("y", True, 2),))
    raw, length = run_encode(req, outs)
    first = raw[length:]
    n = int.from_bytes(first[:4], "little")
    assert first[4:4 + n].decode().endswith(":1")


def test_classification_ranks_integers_in_their_own_type_and_writes_them_as_integers():
    huge = np.array([[2 ** 64 - 2, 2 ** 64 - 1, 5]], dtype=np.uint64)
    assert list(encode.classify(huge, 2, True)[0]) == [f"{2 ** 64 - 1}:1", f"{2 ** 64 - 2}:0"]
    ints = np.array([[3, -(2 ** 63), 100, 100]], dtype=np.int64)
    assert list(encode.classify(ints, 4, True)[0]) == ["100:2", "100:3", "3:0", f"{-(2 ** 63)}:1"]
    assert list(encode.classify(np.array([0.5, 2.0], np.float32), 1, False)) == ["2.000000:1"]


@pytest.mark.parametrize("datatype", ["BOOL", "FP16"])
def test_classification_of_an_output_without_an_order_is_refused(datatype):
    sig = codec.Signature([spec("x", "FP32", [-1, 4])], [spec("o", datatype, [-1, 4])], 8)
    doc = {"inputs": [inp("x", "FP32", [1, 4], [1.0] * 4)],
           "outputs": [{"name": "o", "parameters": {"classification": 2}}]}
    bad(sig, doc, match=f"classification is not available for {datatype}")


def test_a_null_classification_is_no_classification_as_null_is_for_the_other_parameters():
    doc = {"inputs": [inp("x", "FP32", [1, 4], [0] * 4)],
           "outputs": [{"name": "y", "parameters": {"classification": None, "binary_data": None}}]}
    assert decode(BATCHED, doc).outputs == (codec.RequestedOutput("y", None, 0),)
    for wrong in (False, -1, "2"):
        doc["outputs"][0]["parameters"]["classification"] = wrong
        bad(BATCHED, doc, match="classification must be a non-negative integer")


def test_a_raw_body_with_an_open_dimension_is_told_its_length_not_minus_one():
    """A raw body (header length 0) of an input with an open dimension beside the batch that fits no
    row: the refusal's example shape named -1 for that dimension ([2, -1, 4]), which no request may
    send; it names its length instead."""
    sig = codec.Signature([spec("x", "FP32", [-1, -1, 4])], [spec("y", "FP32", [-1, 2])], 8)
    with pytest.raises(InvalidInput) as refused:
        codec.decode_request(b"\0" * 20, 0, sig)
    assert refused.value.message.endswith(
        "a raw body is one row, a multiple of 16 bytes for this input; send several rows with the binary data "
        "extension, a JSON header giving the input's shape (e.g. [2, <length>, 4]) and binary_data_size, its "
        "length in Inference-Header-Content-Length"), refused.value.message
