"""Larger JSON parts are parsed by simdjson (server/json_simd.py), smaller ones by orjson: each
request below, padded past PARSE_FROM_BYTES, must decode to the same arrays, or be refused with
the same message, as when orjson parses it."""
import json

import numpy as np
import pytest

from aclserve.errors import InvalidInput, PayloadTooLarge
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec, json_simd
from aclserve.server.json_simd import JsonNumbers

from .test_codec import inp, spec

SIG = codec.Signature([spec("f", "FP32", [-1, 4]), spec("h", "FP16", [-1, 2]), spec("i8", "INT8", [-1, 2]),
                       spec("i64", "INT64", [-1, 2]), spec("u8", "UINT8", [-1, 2]), spec("u64", "UINT64", [-1, 2]),
                       spec("b", "BOOL", [-1, 2])], [spec("y", "FP32", [-1, 2])], 8)
GOOD = {"f": [0.5, 1, -2.25, 3e-3], "h": [1.5, -2], "i8": [-128, 127], "i64": [2 ** 62 + 1, -(2 ** 63)],
        "u8": [0, 255], "u64": [2 ** 64 - 1, 7], "b": [True, False]}
PAD = "p" * json_simd.PARSE_FROM_BYTES  # an id that takes the JSON part past the threshold


def text(data: dict, **extra) -> bytes:
    doc = {"id": PAD, "inputs": [inp(name, SIG.inputs[name].datatype, [1, SIG.inputs[name].shape[1]], values)
                                 for name, values in data.items()], **extra}
    return json.dumps(doc).encode()


def outcome(raw: bytes, simd: bool, monkeypatch):
    monkeypatch.setattr(json_simd, "PARSE_FROM_BYTES", len(raw) if simd else len(raw) + 1)
    try:
        req = codec.decode_request(raw, None, SIG)
    except (InvalidInput, PayloadTooLarge) as e:
        return type(e).__name__, e.message
    return req.id, {name: (a.dtype.str, a.tolist()) for name, a in req.inputs.items()}


def same_either_way(raw: bytes, monkeypatch):
    fast, plain = outcome(raw, True, monkeypatch), outcome(raw, False, monkeypatch)
    assert fast == plain
    return fast


def test_numbers_read_in_c_are_the_numbers_orjson_reads(monkeypatch):
    raw = text(GOOD)
    doc = json_simd.parse(raw)
    kinds = {item["name"]: type(item["data"]) for item in doc["inputs"]}
    assert kinds == {**{name: JsonNumbers for name in GOOD if name != "b"}, "b": list}
    _, arrays = same_either_way(raw, monkeypatch)
    assert arrays["i64"][1] == [[2 ** 62 + 1, -(2 ** 63)]]  # exact: read as 64-bit integers, not doubles
    assert arrays["u64"][1] == [[2 ** 64 - 1, 7]]
    assert arrays["f"] == ("<f4", [[0.5, 1.0, -2.25, np.float32(3e-3).item()]])


def test_nested_data_is_read_alike(monkeypatch):
    _, arrays = same_either_way(text({**GOOD, "f": [[0.5, 1], [2, 3]]}), monkeypatch)
    assert arrays["f"][1] == [[0.5, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize("name, values, says", [
    ("f", [1.0, True, 2.0, 3.0], "numbers for FP32, not true/false"),
    ("f", [1.0, "2", 2.0, 3.0], "input 'f'"),
    ("f", [1.0, None, 2.0, 3.0], "input 'f'"),
    ("f", [1.0, 1e39, 2.0, 3.0], "input 'f'"),
    ("h", [1.0, 70000], "input 'h'"),
    ("i8", [1, 128], "out of range"),
    ("i8", [1, 1.5], "integers"),
    ("u8", [1, -1], "out of range"),
    ("i64", [1, 2 ** 63], "input 'i64'"),
    ("f", [1.0, 2.0, 3.0], "elements"),
    ("f", [[1.0, 2.0], [3.0]], "input 'f'"),
])
def test_bad_data_gets_the_same_refusal(name, values, says, monkeypatch):
    kind, message = same_either_way(text({**GOOD, name: values}), monkeypatch)
    assert kind == "InvalidInput" and says in message


@pytest.mark.parametrize("raw, says", [
    (b'{"id": "%s", "inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4], "data": [1, NaN, 2, 3]}]}',
     "NaN is not valid JSON"),
    (b'{"id": "%s", "inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4], "data": [1, 1e400, 2, 3]}]}',
     "input 'f'"),
    (b'{"id": "%s", "inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4],}]}',
     "not valid JSON"),
    (b'{"id": "%s", "inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4], "data": "\\ud800"}]}',
     "not valid JSON"),
])
def test_what_simdjson_refuses_orjson_explains(raw, says, monkeypatch):
    raw = raw % PAD.encode()
    assert json_simd.parse(raw) is None
    kind, message = same_either_way(raw, monkeypatch)
    assert kind in ("InvalidInput", "MalformedRequest") and says in message  # (refused by the parse, or its field)


def test_a_repeated_key_keeps_the_last_value_as_orjson_does(monkeypatch):
    raw = (b'{"id": "%s", "inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4], "data": [9, 9, 9, 9], '
           b'"data": [1, 2, 3, 4]}], "id": "last"}' % PAD.encode())
    assert json_simd.parse(raw) is None
    sig = codec.Signature([spec("f", "FP32", [-1, 4])], [spec("y", "FP32", [-1, 2])], 8)
    monkeypatch.setattr(json_simd, "PARSE_FROM_BYTES", 1)
    req = codec.decode_request(raw, None, sig)
    assert req.id == "last" and req.inputs["f"].tolist() == [[1, 2, 3, 4]]


def test_numbers_sent_for_strings_are_refused_as_before(monkeypatch):
    images = codec.Signature([TensorSpec("img", "BYTES", np.dtype(object), (-1,))], [spec("y", "FP32", [-1, 2])], 8)
    raw = json.dumps({"id": PAD, "inputs": [inp("img", "BYTES", [2], [1, 2])]}).encode()
    assert type(json_simd.parse(raw)["inputs"][0]["data"]) is JsonNumbers
    errors = []
    for threshold in (1, len(raw) + 1):
        monkeypatch.setattr(json_simd, "PARSE_FROM_BYTES", threshold)
        with pytest.raises(InvalidInput) as e:
            codec.decode_request(raw, None, images)
        errors.append(e.value.message)
    assert errors[0] == errors[1] and "base64 strings" in errors[0]


def test_a_document_of_many_keys_or_inputs_is_left_to_orjson():
    """simdjson finds an object's key by scanning it, and its document is walked in Python: an
    object of over MAX_KEYS keys, or over MAX_KEYS inputs (a request has a handful of each), is
    read by orjson."""
    def doc(keys: int, inputs: int) -> bytes:
        return json.dumps({"id": PAD, **{f"k{i}": i for i in range(keys)},
                           "inputs": [{"name": "f", "data": [1.0, 2.0]}] * inputs}).encode()
    limit = json_simd.MAX_KEYS
    assert json_simd.parse(doc(limit + 1, 1)) is None and json_simd.parse(doc(0, limit + 1)) is None
    walked = json_simd.parse(doc(limit - 2, limit))
    assert walked["k0"] == 0 and len(walked["inputs"]) == limit
    assert walked["inputs"][-1]["data"].read("f").tolist() == [1.0, 2.0]


# found by differential fuzzing of the two paths: each once differed (a 500, a ragged array or a
# byte order mark accepted, a refusal worded otherwise)
NUMBERS = codec.Signature([spec("x", "FP32", [-1, 2])], [spec("y", "FP32", [-1, 2])], 8)
FLAT = codec.Signature([spec("x", "FP32", [-1])], [spec("y", "FP32", [-1])], 0)
WHOLE = codec.Signature([spec("x", "INT64", [-1, 2])], [spec("y", "FP32", [-1, 2])], 8)
FLAGS = codec.Signature([spec("b", "BOOL", [-1])], [spec("y", "FP32", [-1])], 0)
BOTH = codec.Signature([spec("x", "FP32", [-1, 2]), spec("b", "BOOL", [-1, 2])], [spec("y", "FP32", [-1, 2])], 8)
X = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":%s}]%s}'


@pytest.mark.parametrize("sig, raw", [
    (NUMBERS, X % (b"[1,2]", b',"\\u0000":0')),
    (NUMBERS, b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2],"a\\u0000":0}]}'),
    (NUMBERS, X % (b"[1,[2]]", b"")),
    (FLAT, b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[1,[],[2,3]]}]}'),
    (WHOLE, b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1,2],"data":[7,[[[8]]]]}]}'),
    (NUMBERS, b"\xef\xbb\xbf" + X % (b"[1,2]", b"")),
    (FLAGS, b'{"inputs":[{"name":"b","datatype":"BOOL","shape":[2],"data":[0,true]}]}'),
    (NUMBERS, X % (b"[1,true,3]", b"")),
    (NUMBERS, X % (b"[1e39,true]", b"")),
    (WHOLE, b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1,2],"data":[1.5,true]}]}'),
    (BOTH, X % (b"[1,true]", b"")),
])
def test_what_fuzzing_found_is_decoded_alike(sig, raw, monkeypatch):
    raw = raw + b" " * (json_simd.PARSE_FROM_BYTES - len(raw))  # the real threshold
    outcomes = []
    for threshold in (json_simd.PARSE_FROM_BYTES, len(raw) + 1):
        monkeypatch.setattr(json_simd, "PARSE_FROM_BYTES", threshold)
        try:
            req = codec.decode_request(raw, None, sig)
            outcomes.append({name: a.tolist() for name, a in req.inputs.items()})
        except InvalidInput as e:
            outcomes.append(e.message)
    assert outcomes[0] == outcomes[1]
