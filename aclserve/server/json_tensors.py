"""KServe v2 JSON through orjson: parsing under limits, tensor data to numpy and back.

Parsing. orjson builds the whole object graph before anything can be checked, so the JSON part
of a body is bounded first, on its bytes (json_limits.py: its size, the values and the keys it
may hold). Everything else JSON refuses is refused as the stdlib codec did, with
the same messages: NaN/Infinity literals, nesting deeper than 1024, invalid UTF-8. A number too
large for a double (`1e400`) is refused by orjson for the whole document; the stdlib decoder then
re-reads it (only on that error path) so the overflow becomes inf inside the tensor it belongs
to, and the tensor check names that input. A JSON part of json_simd.PARSE_FROM_BYTES or more is
parsed by simdjson instead when it can (json_simd.py): its inputs' numbers stay in C until
read_numbers reads them, and anything it refuses comes back here, so the messages are these.

Tensor data. A flat list of numbers becomes an array through `array.array` (one C loop that
refuses strings, null and lists; 1.3-1.5x faster than `np.asarray` + `astype`, measured on
12,288 numbers); nested lists, booleans and anything the fast path refuses go through
`np.asarray`, which says precisely what is wrong. A float tensor must come out finite: a value
beyond the datatype's range (1e39 for FP32, 70000 for FP16) is refused, not turned into inf.
Such a value can only come out as an infinity (JSON has no NaN), so an FP32 or FP64 tensor of
up to FINITE_BY_BYTES values is checked by looking for the two infinities' bytes in it; numpy
checks it only when they are found (perhaps across two values) and checks every other tensor.
In the server a numpy check costs about 2 us (a tenth of a light request's CPU at 64 clients).

Responses. Arrays are written by orjson itself (OPT_SERIALIZE_NUMPY: no `tolist()`, float32
values in their shortest float32 form). JSON has no NaN or Infinity, so non-finite outputs are
written as `null` and the output carries `parameters.non_finite_values` (how many); the binary
tensor extension returns them exactly. Whether any output holds one is read from the written
JSON: with no `null` in it there is none, and only otherwise are the arrays checked and the
document written again with the counts.
"""
from __future__ import annotations

import array
import itertools
import math

import numpy as np
import orjson

from ..errors import InvalidInput
from ..runtime.types import TensorSpec
from . import json_simd
from .json_limits import JsonLimits, check_before_parse
from .json_overflow import loads_keeping_overflow
from .json_simd import JsonNumbers


# -- parsing ---------------------------------------------------------------------------------

NOT_JSON = "request body is not valid JSON: "  # how loads() begins its refusal of a body that does not parse
AFTER_JSON = "unexpected content after document"  # orjson's words for a document followed by more


def loads(raw: bytes | memoryview, limits: JsonLimits):
    """Parse the JSON part of a request; InvalidInput / PayloadTooLarge name what is wrong."""
    check_before_parse(raw, limits)
    if len(raw) >= json_simd.PARSE_FROM_BYTES:
        doc = json_simd.parse(raw)
        if doc is not None:
            return doc
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if e.msg.startswith("number is infinity"):
            return loads_keeping_overflow(raw)
        raise InvalidInput(f"{NOT_JSON}{_explain(e)}") from None


def _explain(e: orjson.JSONDecodeError) -> str:
    if "(BOM)" in e.msg:  # an editor's byte order mark: say so, not "binary data"
        return "it begins with a UTF-8 byte order mark, which JSON does not allow"
    if "UTF-8" in e.msg:  # binary tensor data read as JSON, most likely
        return ("it is not UTF-8 text (binary tensor data goes after the JSON part, whose length "
                "Inference-Header-Content-Length gives)")
    if "depth" in e.msg:  # "depth limit exceeded" (3.13), "array and object recursion depth exceeded" (3.11)
        return "nested too deeply"
    if e.msg == "failed to allocate memory":  # orjson's word for a document cut short inside deep nesting
        return "unexpected end of data"
    rest = e.doc[e.pos:e.pos + 8] if isinstance(e.doc, str) else ""
    for literal in ("NaN", "Infinity"):
        if rest.startswith(literal):
            sign = "-" if literal == "Infinity" and e.pos and e.doc[e.pos - 1] == "-" else ""
            return f"{sign}{literal} is not valid JSON (send non-finite numbers with the binary tensor extension)"
    return str(e)


# -- tensor data -> numpy ----------------------------------------------------------------------

# numpy kinds np.asarray may infer from JSON values, accepted per target kind
_JSON_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}
_KIND_WORDS = {"f": "numbers", "i": "integers", "u": "integers", "b": "booleans (true/false)"}
# array.array typecode per numpy dtype (FP16 has none: read as doubles, then rounded once)
_TYPECODES = {np.dtype(code): code for code in "bBhHiIlLqQfd"}
_TYPECODES[np.dtype(np.float16)] = "d"
# Python type of the first element that lets a flat list take the fast path
_FAST_FIRST = {"f": (float, int), "i": (int,), "u": (int,)}


def to_array(name: str, data, spec: TensorSpec, shape: list[int], count: int) -> np.ndarray:
    """The JSON `data` of input `name` as an array of the spec's dtype and the given shape."""
    if type(data) is not list:
        raise InvalidInput(f"input '{name}': data must be an array")
    target = spec.dtype
    code = _TYPECODES.get(target)
    if code is not None and count and len(data) == count and type(data[0]) in _FAST_FIRST[target.kind]:
        try:
            arr = np.frombuffer(array.array(code, data), code)
        except (TypeError, OverflowError, ValueError):
            pass  # a string, null, nested list, float for an integer, out of range: say which below
        else:
            if arr.dtype != target:
                arr = _cast(arr, target)
            _check_finite(name, arr, spec)
            return arr.reshape(shape)
    return _checked_asarray(name, data, spec, shape, count)


def read_numbers(name: str, data: JsonNumbers, spec: TensorSpec, shape: list[int], count: int) -> np.ndarray | None:
    """Input `name`'s data left in simdjson's document (json_simd.py) as an array of the spec's
    dtype and the given shape, read in C, cast, range- and finiteness-checked as to_array does;
    None when to_array must read it as a list and say what is wrong (the caller puts that list in
    the document, where the check for booleans among numbers sees it, in the same order)."""
    target = spec.dtype
    if target.kind not in "iuf" or target not in _TYPECODES or len(data) != count:
        return None
    arr = data.read(target.kind)
    if arr is None or arr.size != count or not _integers_fit(arr, target):
        return None
    if arr.dtype != target:
        arr = _cast(arr, target)
    _check_finite(name, arr, spec)
    return arr.reshape(shape)


def _integers_fit(arr: np.ndarray, target: np.dtype) -> bool:
    """For an integer target, whether every value of `arr` is in its range (else, or for any
    other target, True)."""
    if target.kind not in "iu" or not arr.size:
        return True
    info = np.iinfo(target)
    return info.min <= arr.min() and arr.max() <= info.max


def _checked_asarray(name: str, data: list, spec: TensorSpec, shape: list[int], count: int) -> np.ndarray:
    try:
        arr = np.asarray(data)
    except ValueError:  # ragged, or nested deeper than numpy's dimensions (64)
        data = _flattened(data)
        if data is None:
            raise InvalidInput(f"input '{name}': data is not a rectangular array of numbers") from None
        arr = np.asarray(data)
    if arr.size != count:
        raise InvalidInput(f"input '{name}': data has {arr.size} elements but shape {shape} needs {count}")
    target = spec.dtype
    if target.kind in "iu" and arr.dtype.kind == "f" and count:
        arr = _exact_integers(data, target, arr)
    if arr.dtype != target:
        if count and arr.dtype.kind == "b":
            raise _booleans_refused(name, spec)
        if count and arr.dtype.kind not in _JSON_KINDS[target.kind]:
            if _whole_numbers_out_of_range(arr, target):
                raise InvalidInput(f"input '{name}': data values out of range for {spec.datatype}")
            raise InvalidInput(f"input '{name}': data elements must be {_KIND_WORDS[target.kind]} "
                               f"for {spec.datatype}")
        if not _integers_fit(arr, target):
            raise InvalidInput(f"input '{name}': data values out of range for {spec.datatype}")
        arr = _cast(arr, target)
    _check_finite(name, arr, spec)
    return arr.reshape(shape)


def _flattened(data: list) -> list | None:
    """The values of a rectangular nesting of lists, in order, or None when it is ragged (rows of
    different lengths, lists beside numbers). For what numpy cannot make an array of: a nesting
    deeper than its 64 dimensions (a tester's [[[...[1, 2, 3, 4]...]]] of 500 levels, which Triton
    flattens) is read as the values it holds, as any other nesting is. One level a step, each
    step in C (map, chain); the steps' work is bounded by the text's values (every `[` counts
    among the max_json_elements), and only this error path pays it."""
    level = data
    while True:
        kinds = set(map(type, level))
        if list not in kinds:
            return level
        if len(kinds) > 1 or len(set(map(len, level))) > 1:
            return None
        level = list(itertools.chain.from_iterable(level))


def _exact_integers(data: list, target: np.dtype, inferred: np.ndarray) -> np.ndarray:
    """Nested integers numpy read as floats, for an integer target: int64 and uint64 ones mixed
    (2**63 beside 1) make floats, which lose the last digits of the large ones and are then
    refused, where the same integers written flat pass (array.array keeps them). Kept exact when
    they are all integers in the target's range; else `inferred`, whose checks say what is wrong."""
    values = np.array(data, dtype=object).ravel().tolist()
    info = np.iinfo(target)
    if len(values) != inferred.size or not all(type(v) is int and info.min <= v <= info.max for v in values):
        return inferred
    return np.array(values, dtype=target).reshape(inferred.shape)


def _whole_numbers_out_of_range(arr: np.ndarray, target: np.dtype) -> bool:
    """For an integer target, whether `arr` holds whole numbers some of which are out of its range:
    integers past 64 bits (orjson makes them floats), or int64 and uint64 ones mixed (numpy makes
    them floats), so that the client hears what is wrong rather than "must be integers"."""
    if target.kind not in "iu" or arr.dtype.kind not in "fO":
        return False
    values = arr.ravel().tolist()
    if not all(type(v) is int or (type(v) is float and math.isfinite(v) and v.is_integer()) for v in values):
        return False
    info = np.iinfo(target)
    # (a float at or past the 64-bit bounds is an integer past them, rounded: -2**63 - 1 reads as -2**63)
    return any(not info.min <= int(v) <= info.max or (type(v) is float and not _FLOAT_LOW < v < _FLOAT_HIGH)
               for v in values)


_FLOAT_LOW, _FLOAT_HIGH = -2.0 ** 63, 2.0 ** 64  # orjson keeps integers within these as ints


def _booleans_refused(name: str, spec: TensorSpec) -> InvalidInput:
    return InvalidInput(f"input '{name}': data elements must be {_KIND_WORDS[spec.dtype.kind]} for "
                        f"{spec.datatype}, not true/false")


# -- booleans among numbers ----------------------------------------------------------------------
# Python's bool is an int, so both conversions above read `true` as 1 where a number belongs
# (Triton refuses it). Looking at every value's type costs about 15 ns a value, as much again as
# the conversion, so it is done only when the JSON text holds more `true` / `false` than the
# places booleans belong (parameters, BOOL inputs): counting them in the text is a memchr over
# two letters numbers never hold.

_LITERAL_SCAN_CAP = 4096  # letters looked at; past this the values' types are checked instead


def bool_literals(raw: bytes | memoryview) -> int:
    """At least the number of `true` and `false` in the JSON text `raw` (strings included),
    found by their third letter; _LITERAL_SCAN_CAP + 1 when there are too many letters to look
    at each."""
    text = raw if type(raw) is bytes else bytes(raw)
    found = seen = 0
    for letter, word in ((b"u", b"true"), (b"l", b"false")):
        at = text.find(letter, 2)
        while at != -1:
            seen += 1
            if seen > _LITERAL_SCAN_CAP:
                return _LITERAL_SCAN_CAP + 1
            if text.startswith(word, at - 2):
                found += 1
            at = text.find(letter, at + 1)
    return found


def numbers_in_json(doc: dict, sig_inputs: dict) -> list:
    """(name, data, spec) of each input whose JSON data must hold numbers: the places a boolean
    may hide (none for a request whose tensors are all binary)."""
    found = []
    for item in doc["inputs"]:
        spec = sig_inputs[item["name"]]
        if "data" in item and spec.dtype.kind in "iuf":
            found.append((item["name"], item["data"], spec))
    return found


# Values of the JSON outside the tensors' data whose booleans are counted (containers, and the
# elements of lists that hold containers, are looked at one by one in Python): past it the data
# is searched instead. Parameters hold a handful; 520,000 empty lists in an unused key took the
# event loop 170 ms to walk.
ELSEWHERE_VALUES = 4096


def refuse_booleans_among_numbers(doc: dict, text: bytes | memoryview, numeric: list) -> None:
    """InvalidInput naming the first of `numeric` (numbers_in_json) whose data holds a boolean,
    looked for only when the JSON `text` holds more `true` / `false` than the booleans found
    elsewhere (counted while that takes at most ELSEWHERE_VALUES steps)."""
    literals = bool_literals(text)
    if not literals:
        return
    names = {name for name, _, _ in numeric}
    elsewhere = None
    if len(doc) + sum(len(item) for item in doc["inputs"]) <= ELSEWHERE_VALUES:  # keys walked in Python
        values = [value for key, value in doc.items() if key != "inputs"]
        for item in doc["inputs"]:  # (as many as the model has inputs: they were decoded)
            if item["name"] in names:
                values.extend(value for key, value in item.items() if key != "data")
            else:
                values.append(item)
        elsewhere = _count_bools(values, budget=ELSEWHERE_VALUES)
    # (a count past _LITERAL_SCAN_CAP is only a floor: 4,097 booleans in a parameter hid a `true`
    # among an FP32 input's numbers)
    if elsewhere is not None and literals <= min(elsewhere, _LITERAL_SCAN_CAP):
        return
    for name, data, spec in numeric:
        if _count_bools(data, stop_at_one=True):
            raise _booleans_refused(name, spec)


def _count_bools(value, stop_at_one: bool = False, budget: int | None = None) -> int | None:
    """Booleans in a parsed JSON value (no recursion: orjson nests 1024 deep). With `budget`:
    None once more than that many containers and elements of lists holding containers have been
    looked at in Python."""
    found = 0
    stack = [value]
    while stack:
        value = stack.pop()
        if type(value) is dict:
            value = list(value.values())
        if type(value) is not list:
            found += type(value) is bool
            continue
        if budget is not None:
            budget -= 1
            if budget < 0:
                return None
        kinds = set(map(type, value))
        if bool in kinds:
            found += list(map(type, value)).count(bool)  # (C: no step of Python per element)
            if stop_at_one:
                return found
        if list in kinds or dict in kinds:
            if budget is not None:
                budget -= len(value)
                if budget < 0:
                    return None
            stack.extend(v for v in value if type(v) is list or type(v) is dict)
    return found


def _cast(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # an overflow becomes inf, which _check_finite refuses
        return arr.astype(target)


FINITE_BY_BYTES = 4096  # larger tensors are checked by numpy at once (a byte search copies them)
# each float dtype checked by bytes: its +inf and -inf as they lie in memory
_INFINITIES = {np.dtype(t): tuple(np.array([v], t).tobytes() for v in (np.inf, -np.inf))
               for t in ("f4", "f8")}


def _check_finite(name: str, arr: np.ndarray, spec: TensorSpec) -> None:
    """JSON numbers are finite, so inf here is a value beyond the datatype's range (and NaN
    cannot come out of a conversion from JSON numbers: only the infinities are looked for)."""
    if arr.dtype.kind != "f" or not arr.size:
        return
    infinities = _INFINITIES.get(arr.dtype)
    if infinities is not None and arr.size <= FINITE_BY_BYTES:
        raw = arr.tobytes()
        if infinities[0] not in raw and infinities[1] not in raw:
            return
    if not np.isfinite(arr).all():
        raise InvalidInput(f"input '{name}': data values out of range for {spec.datatype}")


# -- numpy -> response JSON ----------------------------------------------------------------------

def output_entry(name: str, datatype: str, arr: np.ndarray) -> dict:
    """One JSON output of a response (its non-finite values are counted by dumps_response)."""
    return {"name": name, "datatype": datatype, "shape": list(arr.shape),
            "data": np.ascontiguousarray(arr).reshape(-1)}


def dumps_response(doc: dict) -> bytes:
    """The response's JSON. Non-finite values are written as null, and an output of
    `doc["outputs"]` whose data (made by output_entry) holds any gets
    `parameters.non_finite_values`, their count. With no `null` in the JSON there is none (a
    `null` elsewhere, in a name, only costs the check)."""
    written = dumps(doc)
    if b"null" not in written:
        return written
    counted = False
    for entry in doc["outputs"]:
        data = entry.get("data")  # binary outputs have none here
        if isinstance(data, np.ndarray) and data.dtype.kind == "f":
            non_finite = non_finite_count(data)
            if non_finite:
                entry["parameters"] = {"non_finite_values": non_finite}
                counted = True
    return dumps(doc) if counted else written


def non_finite_count(data: np.ndarray) -> int:
    """How many of a float array's values JSON writes as null (NaN and the infinities)."""
    return data.size - int(np.count_nonzero(np.isfinite(data)))


def _fallback(value):
    if isinstance(value, np.ndarray):  # dtypes orjson does not write itself (e.g. strings)
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(doc) -> bytes:
    """Compact JSON; numpy arrays written by orjson (NaN and infinities as null)."""
    return orjson.dumps(doc, default=_fallback, option=orjson.OPT_SERIALIZE_NUMPY)
