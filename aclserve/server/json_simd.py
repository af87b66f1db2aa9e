"""The JSON part of a larger request parsed by simdjson, its tensor data left in C.

orjson turns every number of a tensor's `data` into a Python float before anything can read
it, and reading those floats back into an array costs as much again: for the medium CNN's
12,288 numbers (85 KB of JSON) about 370 us of the event loop's core, more than half of the
request's host work. simdjson parses the text into its own document (in C++), and its
`as_buffer` reads a whole array of numbers out of it as doubles or 64-bit integers in one C
loop: 135 us for the same body. Small parts stay with orjson, which needs no walk of the
document in Python (orjson / simdjson: 3.1 / 4.2 us for the light MLP's 533 bytes, 16.9 / 8.9 us
at 3.6 KB), below PARSE_FROM_BYTES.

Only an accelerator: anything simdjson refuses (invalid JSON, NaN, a number beyond a double,
nesting past 1024, invalid UTF-8), a text with a backslash (an escape; pysimdjson cuts a key at
a \\u0000, and a key written with escapes cannot be found in the text), a UTF-8 byte order mark
(simdjson skips it, orjson refuses it), an array under a "data" key that holds an array
(as_buffer would flatten a ragged one), more than MAX_DATA_KEYS `"data"` strings in the text, a
repeated key (orjson keeps the last, simdjson's lookup the first), more than MAX_KEYS keys in an
object or items in `inputs`, or a document that is not an object returns None, and orjson parses
it with the messages it always gave. Every value but the inputs' `data` arrays becomes the same
Python value orjson gives; a `data` array whose first element is a number stays in the document
as JsonNumbers, which json_tensors.read_numbers reads in C; when that read does not apply the
codec puts the array's list in its place for to_array, so every check and message is the list's.
"""
from __future__ import annotations

import re

import numpy as np
import simdjson

PARSE_FROM_BYTES = 2048  # shorter JSON parts go to orjson (measured crossover about 1 KB)
_NUMBER_TYPES = (int, float)  # `type(x) in`: a bool is not among them
_BUFFER_TYPES = {"f": ("d", np.float64), "i": ("i", np.int64), "u": ("u", np.uint64)}


class JsonNumbers:
    """An input's `data` array inside its parsed document (which it keeps alive)."""

    __slots__ = ("_array",)

    def __init__(self, array: simdjson.Array):
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    def read(self, kind: str) -> np.ndarray | None:
        """The array's values as float64 (kind "f"), int64 ("i") or uint64 ("u"), flattened; None
        when one is not a number of that kind (a bool, a string, null, a fraction for an integer
        kind, out of the 64-bit range)."""
        of_type, dtype = _BUFFER_TYPES[kind]
        try:
            return np.frombuffer(self._array.as_buffer(of_type=of_type), dtype)
        except (TypeError, ValueError):
            return None

    def as_list(self) -> list:
        return self._array.as_list()


def parse(raw: bytes | memoryview) -> dict | None:
    """The JSON object in `raw` with its inputs' numeric `data` arrays as JsonNumbers, or None
    (orjson then parses it: see the module's docstring)."""
    text = raw if type(raw) is bytes else bytes(raw)
    if text.startswith(_BOM) or not _data_arrays_flat(text):
        return None
    try:
        root = simdjson.Parser().parse(text)
    except Exception:  # any refusal: orjson's message is the one given
        return None
    if type(root) is not simdjson.Object:
        return None
    doc = _object(root, "inputs", _inputs)
    return None if doc is _TO_ORJSON else doc


_BOM = b"\xef\xbb\xbf"  # simdjson skips a UTF-8 byte order mark, orjson refuses it
_DATA_KEY = b'"data"'
_SPACE = re.compile(rb"[ \t\r\n]*")  # JSON's whitespace, skipped in C
# `"data"` strings looked at; a text with more goes to orjson. A request has one per input (at
# most MAX_KEYS of them walked); each one looked at costs a few steps of Python, and 16 MB of
# `"data"` repeated (2.8 million) held the event loop 1.4 s
MAX_DATA_KEYS = 256


def _data_arrays_flat(text: bytes) -> bool:
    """Whether no array under a key "data" holds an array. simdjson's as_buffer flattens nested
    arrays (a ragged [1, [], [2, 3]] would pass for three numbers) and a proxy cannot say where
    its array lies, so the text is read: a `"data"` followed by a colon is a key (a quote inside
    a string is escaped), and a flat array has no `[` before its first `]`. A key written with
    escapes would not be found, so a text with any backslash is left to orjson too (tensor
    requests have none: 2 us to look, memchr; a search for a longer needle runs at about 1
    byte a ns, so after an array the search goes on from its end). More than MAX_DATA_KEYS
    `"data"` strings: False (orjson reads it). Whitespace is skipped by a regular expression:
    a byte at a time in Python, 16 MB of spaces after a `"data"` held the event loop 4 s."""
    if text.find(b"\\") >= 0:
        return False
    at = text.find(_DATA_KEY)
    for _ in range(MAX_DATA_KEYS):
        if at < 0:
            return True
        after = pos = _skip_space(text, at + len(_DATA_KEY))
        if text[pos:pos + 1] == b":":
            pos = _skip_space(text, pos + 1)
            if text[pos:pos + 1] == b"[":
                close = text.find(b"]", pos + 1)
                if close < 0 or text.find(b"[", pos + 1, close) >= 0:
                    return False
                after = close + 1
        at = text.find(_DATA_KEY, after)
    return at < 0


def _skip_space(text: bytes, pos: int) -> int:
    return _SPACE.match(text, pos).end()


_TO_ORJSON = object()  # a repeated key, or too many: the document is orjson's to read
# keys of an object, and items of `inputs`, walked here; a document with more goes to orjson.
# A request has a handful of each, and the walk is Python: simdjson finds a key by scanning its
# object (20,000 keys took 0.3 s to walk), and 64,000 inputs took 150 ms (orjson: about 20)
MAX_KEYS = 64


def _object(obj: simdjson.Object, key_of_note: str, read_it):
    """`obj` as a dict of Python values, but for `read_it(value)` under `key_of_note`."""
    keys = list(obj.keys())
    if len(keys) > MAX_KEYS or len(set(keys)) != len(keys):
        return _TO_ORJSON
    out = {}
    for key in keys:
        value = out[key] = read_it(obj[key]) if key == key_of_note else _python(obj[key])
        if value is _TO_ORJSON:
            return _TO_ORJSON
    return out


def _inputs(value):
    if type(value) is not simdjson.Array:
        return _python(value)
    if len(value) > MAX_KEYS:
        return _TO_ORJSON
    items = [_object(item, "data", _data) if type(item) is simdjson.Object else _python(item)
             for item in value]  # iterated: indexing scans the array from its start
    return _TO_ORJSON if any(item is _TO_ORJSON for item in items) else items


def _data(value):
    """A numeric array stays in the document; anything else becomes its Python value."""
    if type(value) is simdjson.Array and len(value) and type(value[0]) in _NUMBER_TYPES:
        return JsonNumbers(value)
    return _python(value)


def _python(value):
    if type(value) is simdjson.Object:
        return value.as_dict()
    if type(value) is simdjson.Array:
        return value.as_list()
    return value
