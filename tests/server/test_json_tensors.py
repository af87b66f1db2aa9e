"""KServe v2 JSON through orjson: limits, refusals with their messages, the fast tensor path
against np.asarray, and non-finite outputs. Pure functions, no network."""
import json

import numpy as np
import orjson
import pytest

from aclserve.dtypes import kserve_to_numpy
from aclserve.errors import InvalidInput, PayloadTooLarge
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec, encode
from aclserve.server.http_errors import http_status
from aclserve.server.json_limits import JsonLimits, value_bound
from aclserve.server.json_tensors import to_array


def spec(name, datatype, shape):
    return TensorSpec(name, datatype, kserve_to_numpy(datatype), tuple(shape))


def one_input(datatype, width=4, limits=JsonLimits()):
    return codec.Signature([spec("x", datatype, [-1, width])], [spec("y", "FP32", [-1, 2])], 8, limits)


TWO = codec.Signature([spec("a", "FP32", [-1, 2]), spec("b", "INT32", [-1, 3])], [spec("y", "FP32", [-1, 2])], 4)


def decode(sig, raw: bytes, header=None):
    return codec.decode_request(raw, header, sig)


def x_body(data, datatype="FP32", shape=(1, 4), **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": list(shape), "data": data}],
                       **extra}).encode()


@pytest.mark.parametrize("datatype,data", [
    ("FP32", [0.1, -2.5, 3, 1e-30]),
    ("FP32", [3.4028234663852886e38, -1.0e-45, 0, 2**70]),  # float32 max, subnormal, int, huge int
    ("FP64", [0.1, 1e308, -5e-324, 7]),
    ("FP16", [0.1, 65504.0, -0.0001, 3]),
    ("INT8", [-128, 127, 0, 1]),
    ("UINT8", [0, 255, 1, 2]),
    ("INT32", [-2**31, 2**31 - 1, 0, 5]),
    ("INT64", [-2**63, 2**63 - 1, 0, 5]),
    ("UINT64", [0, 2**64 - 1, 3, 5]),
])
def test_flat_lists_convert_exactly_as_numpy_does(datatype, data):
    got = decode(one_input(datatype), x_body(data, datatype)).inputs["x"]
    want = np.array(data, kserve_to_numpy(datatype)).reshape(1, 4)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("datatype,data,match", [
    ("FP32", [1.0, "2", 3, 4], "elements must be numbers for FP32"),
    ("FP32", [1.0, None, 3, 4], "elements must be numbers"),
    ("FP32", [1.0, [2.0], 3, 4], "rectangular"),
    ("FP32", [True, False, True, False], "elements must be numbers"),
    ("INT8", [-128, 127, 0, True], "integers for INT8, not true/false"),  # read as 1 by both conversions
    ("FP32", [1e39, 0, 0, 0], "values out of range for FP32"),
    ("FP32", [0, 0, 0, -1e39], "values out of range for FP32"),
    ("FP32", [[1e39, 0, 0, 0]], "values out of range for FP32"),  # nested: the np.asarray path
    ("FP16", [0, 70000.0, 0, 0], "values out of range for FP16"),
    ("INT32", [1, 2.5, 3, 4], "elements must be integers for INT32"),
    ("INT32", [1, 2**40, 3, 4], "values out of range for INT32"),
    ("UINT8", [1, -1, 3, 4], "values out of range for UINT8"),
    ("BOOL", [1, 0, 1, 0], "booleans"),
    ("FP32", [1, 2, 3], "has 3 elements but shape"),
])
def test_refusals_keep_their_messages(datatype, data, match):
    with pytest.raises(InvalidInput, match=match) as info:
        decode(one_input(datatype), x_body(data, datatype))
    assert info.value.message.startswith("input 'x'")


def test_a_number_too_large_for_a_double_names_its_input():
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1e400, 0, 0]}]}'
    with pytest.raises(InvalidInput, match="input 'x': data values out of range for FP32"):
        decode(one_input("FP32"), raw)
    raw = (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [0, 0]},'
           b' {"name": "b", "datatype": "INT32", "shape": [1, 3], "data": [1, -1e400, 3]}]}')
    with pytest.raises(InvalidInput, match="input 'b': data elements must be integers"):
        decode(TWO, raw)
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}],' \
          b' "parameters": {"timeout": 1e400}}'
    with pytest.raises(InvalidInput, match="parameters.timeout"):
        decode(one_input("FP32"), raw)


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_too_large_for_a_double_names_its_field(sign):
    """400 digits: beyond 64 bits and beyond a double (float() of it raised OverflowError: a 500)."""
    huge = (sign + "9" * 400).encode()
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, %s, 0, 0]}]}' % huge
    with pytest.raises(InvalidInput, match="input 'x': data values out of range for FP32"):
        decode(one_input("FP32"), raw)
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, %s], "data": [0]}]}' % huge
    with pytest.raises(InvalidInput, match="input 'x'.*shape"):
        decode(one_input("FP32"), raw)
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}],' \
          b' "parameters": {"timeout": %s}}' % huge
    with pytest.raises(InvalidInput, match="parameters.timeout"):
        decode(one_input("FP32"), raw)


@pytest.mark.parametrize("raw,match", [
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [NaN, 0, 0, 0]}]}',
     "not valid JSON: NaN is not valid JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, -Infinity, 0, 0]}]}',
     "not valid JSON: -Infinity is not valid JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, Infinity, 0]}]}',
     "not valid JSON: Infinity is not valid JSON"),
    (b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", "not valid JSON: nested too deeply"),
    (b'{"inputs": [1e400, ' + b"[" * 5000 + b"]" * 5000 + b"]}", "not valid JSON: nested too deeply"),
    (b'{"id": "\xff"}', "not valid JSON"),
    (b'{"inputs": [] ', "not valid JSON"),
    (b'\xef\xbb\xbf{"inputs": []}', "not valid JSON: it begins with a UTF-8 byte order mark"),
    (b'{"inputs": ' + b"[" * 300, "not valid JSON: unexpected end of data$"),  # orjson: "failed to allocate"
])
def test_invalid_json_messages(raw, match):
    with pytest.raises(InvalidInput, match=match):
        decode(one_input("FP32"), raw)


def test_the_json_part_is_limited_in_bytes_not_the_binary_part():
    sig = one_input("FP32", width=64, limits=JsonLimits(max_bytes=600))
    small = [0.5] * 64
    assert decode(sig, x_body(small, shape=(1, 64))).inputs["x"].shape == (1, 64)
    big = [0.123456] * 64
    with pytest.raises(PayloadTooLarge, match=r"over the limit of 600 \(max_json_bytes\)") as info:
        decode(sig, x_body(big, shape=(1, 64)))
    assert http_status(info.value) == 413
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 64],
                                   "parameters": {"binary_data_size": 8 * 64 * 4}}]}).encode()
    binary = head + np.ones((8, 64), np.float32).tobytes()  # 2 KB body, short JSON header
    assert decode(sig, binary, len(head)).inputs["x"].shape == (8, 64)


def test_json_values_are_bounded_before_parsing():
    sig = one_input("FP32", limits=JsonLimits(max_elements=100))
    raw = x_body([0] * 4, parameters={"junk": [[]] * 200})
    with pytest.raises(PayloadTooLarge, match=r"holds more than 100 values \(max_json_elements\)"):
        decode(sig, raw)
    assert decode(sig, x_body([0] * 4, parameters={"note": "," * 50})).rows == 1  # under 100 bytes of separators


@pytest.mark.parametrize("doc", [[], {}, [[], [1, 2], {"a": [3, {"b": []}]}], [0] * 1000, "a,b[c{"])
def test_value_bound_is_never_below_the_real_count(doc):
    def count(v):
        if isinstance(v, list):
            return 1 + sum(count(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(1 + count(x) for x in v.values())  # keys are values too
        return 1
    raw = orjson.dumps(doc)
    assert value_bound(raw) >= count(doc)


def test_the_fast_path_and_numpy_agree_on_random_float32_text():
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).tolist()
    data = orjson.loads(orjson.dumps(values))
    got = to_array("x", data, spec("x", "FP32", [-1, 4096]), [1, 4096], 4096)
    np.testing.assert_array_equal(got[0], np.asarray(values).astype(np.float32))


# -- responses ---------------------------------------------------------------------------------

SIG = codec.Signature([spec("x", "FP32", [-1, 4])],
                      [spec("y", "FP32", [-1, 2]), spec("h", "FP16", [-1, 2]), spec("z", "INT64", [-1]),
                       spec("m", "BOOL", [-1])], 8)


def test_outputs_are_written_exactly_and_non_finite_values_become_null():
    y = np.array([[np.nan, np.inf], [-np.inf, 0.1]], np.float32)
    outputs = {"y": y, "h": np.array([[0.1, 65504], [-2, 1e-4]], np.float16),
               "z": np.array([2**62 + 1, -7], np.int64), "m": np.array([True, False])}
    raw, length = encode.encode_response("m", "1", codec.InferRequest({}, 2), outputs, SIG, batched=True)
    assert length is None
    doc = json.loads(raw)  # strict JSON: the stdlib accepts no NaN here because there is none
    out = {o["name"]: o for o in doc["outputs"]}
    assert out["y"]["data"] == [None, None, None, pytest.approx(0.1)]
    assert out["y"]["parameters"] == {"non_finite_values": 3}
    assert np.float32(out["y"]["data"][3]) == np.float32(0.1)
    np.testing.assert_array_equal(np.array(out["h"]["data"], np.float16), outputs["h"].ravel())
    assert "parameters" not in out["h"] and out["h"]["shape"] == [2, 2]
    assert out["z"]["data"] == [2**62 + 1, -7] and out["m"]["data"] == [True, False]


@pytest.mark.parametrize("datatype,value,finite", [
    ("FP32", 3.4028234663852886e38, True),  # the largest float32
    ("FP32", 3.4028235677973362e38, True),  # just under the rounding edge: still the largest
    ("FP32", 3.4028235677973366e38, False),  # rounds to inf
    ("FP64", 1.7976931348623157e308, True),
    ("FP32", 2.007781982421875, True),  # after a 0, the two values' bytes hold +inf's across them
])
def test_the_range_check_agrees_with_numpy_at_the_edges(datatype, value, finite):
    for data in ([0.0, value, 0.0, 0.0], [0.0, -value, 0.0, 0.0]):
        if finite:
            got = decode(one_input(datatype), x_body(data, datatype)).inputs["x"]
            assert np.isfinite(got).all() and got[0, 1] == np.array(data[1], got.dtype)
        else:
            with pytest.raises(InvalidInput, match=f"values out of range for {datatype}"):
                decode(one_input(datatype), x_body(data, datatype))
    raw = x_body([0, 0, 0, 0], "FP64").replace(b"[0, 0, 0, 0]", b"[0, -1e400, 0, 0]")
    with pytest.raises(InvalidInput, match="values out of range for FP64"):  # inf through the stdlib fallback
        decode(one_input("FP64"), raw)


def test_a_null_elsewhere_in_the_answer_adds_no_count():
    only_y = codec.InferRequest({}, 1, id="null", outputs=(codec.RequestedOutput("y"),))
    outputs = {"y": np.array([[0.5, 1.5]], np.float32)}
    raw, _ = encode.encode_response("null", "1", only_y, outputs, SIG, batched=True)
    assert json.loads(raw)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]}]
    outputs = {"y": np.array([[0.5, np.nan]], np.float32)}
    raw, _ = encode.encode_response("null", "1", only_y, outputs, SIG, batched=True)
    assert json.loads(raw)["outputs"][0]["parameters"] == {"non_finite_values": 1}


def test_float32_outputs_round_trip_through_their_json_text():
    rng = np.random.default_rng(5)
    y = (rng.standard_normal((64, 2)) * 10.0 ** rng.integers(-38, 38, (64, 2))).astype(np.float32)
    req = codec.InferRequest({}, 64, outputs=(codec.RequestedOutput("y"),))
    raw, _ = encode.encode_response("m", "1", req, {"y": y}, SIG, batched=True)
    data = json.loads(raw)["outputs"][0]["data"]
    np.testing.assert_array_equal(np.array(data, np.float32).reshape(64, 2), y)


def test_the_default_limits_are_the_configs():
    from aclserve.config import ServerConfig
    config = ServerConfig()
    assert JsonLimits() == JsonLimits(config.max_json_bytes, config.max_json_elements)


@pytest.mark.parametrize("elsewhere", [
    {"parameters": {"flags": [False] * 5000}},  # more booleans than the text's letters are counted
    {"inputs_note": "u" * 5000, "junk": [False] * 4097},  # letters u / l past the cap, and booleans
])
def test_a_boolean_among_numbers_is_refused_whatever_else_holds_booleans(elsewhere):
    """bool_literals stops counting at _LITERAL_SCAN_CAP: a count that large is a floor, never
    taken as all the booleans there are (else `true` passed as 1 beside 4,097 booleans)."""
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, True, 3.0, 4.0]}
    sig = codec.Signature([TensorSpec("x", "FP32", np.dtype(np.float32), (-1, 4))],
                          [TensorSpec("y", "FP32", np.dtype(np.float32), (-1, 2))], 8)
    with pytest.raises(InvalidInput, match="numbers for FP32, not true/false"):
        codec.decode_request(json.dumps({"inputs": [x], **elsewhere}).encode(), None, sig)


@pytest.mark.parametrize("where", ['"id": "\\ud800"', '"id": "a\\udfff\\ud800"', '"\\udc00": 1',
                                   '"outputs": [{"name": "\\ud83d"}]', '"parameters": {"p": ["\\uDBFF"]}'])
def test_a_lone_surrogate_is_refused_when_the_stdlib_parses(where):
    """A number too large for a double sends the document to the stdlib decoder, which takes a
    lone surrogate escape that orjson refuses; a string holding one cannot be written back as
    JSON, so an answer quoting it (the id echoed, an unknown name) failed as a 500."""
    raw = ('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1e400, 0, 0]}], '
           + where + '}').encode()
    with pytest.raises(InvalidInput, match="lone surrogate"):
        decode(one_input("FP32"), raw)
    with pytest.raises(InvalidInput, match="not valid JSON"):  # as orjson refuses it without the overflow
        decode(one_input("FP32"), raw.replace(b"1e400", b"0"))


def test_surrogate_pairs_and_escaped_backslashes_pass_the_stdlib():
    raw = (b'{"id": "\\ud83d\\ude00 \\\\ud800", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],'
           b' "data": [0, 1e400, 0, 0]}]}')
    with pytest.raises(InvalidInput, match="input 'x': data values out of range for FP32"):
        decode(one_input("FP32"), raw)


@pytest.mark.parametrize("datatype,row", [
    ("UINT64", [2**63, 1, 2, 3]),  # int64 and uint64 mixed: numpy reads floats
    ("UINT64", [2**64 - 1, 0, 0, 0]),
    ("INT64", [-2**63, 2**62 + 1, 0, 1]),
])
def test_nested_integers_are_exact_as_flat_ones(datatype, row):
    """Written nested, 2**63 beside 1 became a float64 array (numpy's inference): refused as
    "must be integers", or 2**64-1 as out of range, where the same values flat passed (from a
    differential fuzz of the JSON codec)."""
    flat = decode(one_input(datatype), x_body(row, datatype)).inputs["x"]
    nested = decode(one_input(datatype), x_body([row], datatype)).inputs["x"]
    assert nested.dtype == flat.dtype == kserve_to_numpy(datatype)
    assert nested.tolist() == flat.tolist() == [row]
    for bad, match in (([[2**64, 0, 0, 0]], "out of range"), ([[2**63, 1.5, 0, 0]], "must be integers")):
        if datatype == "UINT64":
            with pytest.raises(InvalidInput, match=match):
                decode(one_input(datatype), x_body(bad, datatype))


def test_a_number_beyond_a_double_keeps_orjsons_depth_and_integers_wherever_it_is_decoded():
    """A body with 1e400 is read again by the stdlib's parser, which nested only as deep as the
    interpreter's recursion limit less its caller's depth: one HTTP path refused at 974 levels,
    the other at 979, where orjson takes 1,024 (from a differential fuzz of the two paths). It
    also kept integers beyond 64 bits, which orjson makes floats (FP32 data refused), and quoted
    Python's own advice for 5,000 digits."""
    row = b'"data": [[1, 2, 3, 4]]}], '
    def body(depth):
        return (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], ' + row
                + b'"zz": ' + b"[" * (depth - 1) + b"1e400" + b"]" * (depth - 1) + b"}")

    def decode_from_depth(frames, raw):
        return decode(one_input("FP32"), raw) if frames == 0 else decode_from_depth(frames - 1, raw)

    for frames in (0, 600):
        assert decode_from_depth(frames, body(1024)).inputs["x"].tolist() == [[1, 2, 3, 4]]
        with pytest.raises(InvalidInput, match="nested too deeply"):
            decode_from_depth(frames, body(1025))
    huge = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[-9223372036854775809, 1, 2, 3]]}]'
    assert decode(one_input("FP32"), huge + b', "zz": 1e400}').inputs["x"][0, 0] == np.float32(-2**63)
    with pytest.raises(InvalidInput, match="an integer of 5,000 digits$"):
        decode(one_input("FP32"), b'{"zz": [1e400, ' + b"7" * 5000 + b"]}")


def _nested(values: list, levels: int) -> list:
    for _ in range(levels):
        values = [values]
    return values


@pytest.mark.parametrize("width", [4, 400], ids=["orjson", "simdjson-sized"])
def test_data_nested_past_numpys_dimensions_is_read_as_its_values(width):
    """A tester's find: [1, 2, 3, 4] inside 500 levels of [ ] with shape [1, 4] was refused as
    "not a rectangular array of numbers" (numpy makes at most 64 dimensions), on both parsers'
    paths (a body of 2 KB or more is offered to simdjson, which leaves nested data to orjson);
    Triton flattens it. Now any rectangular nesting is read as its values, as a shallower one
    was; a ragged one deep down, a boolean or a value out of range is still refused."""
    values = [v % 100 for v in range(1, width + 1)]
    for datatype in ("FP32", "INT64", "UINT8"):
        raw = x_body(_nested(values, 499), datatype, (1, width))
        assert len(raw) > 2048 or width == 4
        got = decode(one_input(datatype, width), raw).inputs["x"]
        np.testing.assert_array_equal(got, np.array([values], kserve_to_numpy(datatype)))
    rows = [_nested([float(v), float(v + 1)], 80) for v in (0, 2)]  # two rows of 80 levels, then the pair
    np.testing.assert_array_equal(decode(one_input("FP32"), x_body(rows)).inputs["x"], [[0, 1, 2, 3]])
    for data, match in (([_nested([1, 2], 80), _nested([3], 80), 4], "rectangular"),
                        ([_nested([1, 2], 80), _nested([3, [4]], 80)], "rectangular"),
                        (_nested([1, 2, True, 4], 100), "not true/false"),
                        (_nested([1, 2, 3, 256], 100), "out of range for UINT8")):
        with pytest.raises(InvalidInput, match=match):
            decode(one_input("UINT8"), x_body(data, "UINT8"))
