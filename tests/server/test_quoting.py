"""Client values quoted by error messages: JSON's spelling, bounded (aclserve/quoting.py)."""
import json

import pytest

from aclserve.dtypes import kserve_to_numpy
from aclserve.errors import InvalidInput
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec
from aclserve.quoting import MAX_QUOTED, MAX_QUOTED_NAME, listed_names, quoted

SIG = codec.Signature([TensorSpec("x", "FP32", kserve_to_numpy("FP32"), (-1, 4))],
                      [TensorSpec("y", "FP32", kserve_to_numpy("FP32"), (-1, 2))], 8)


@pytest.mark.parametrize("value,text", [
    (True, "true"), (None, "null"), ("abc", '"abc"'), (1.5, "1.5"), (-3, "-3"), ([], "[]"), ({}, "{}"),
    ([1], "an array of 1 item"), ([[]] * 3, "an array of 3 items"), ({"a": 1, "b": 2}, "an object of 2 keys"),
    (float("inf"), "a number beyond a double's range"), (float("nan"), "NaN"), (2**64, str(2**64)),
    (-10**100, "an integer of 101 digits"), ("x" * 100, '"' + "x" * MAX_QUOTED + '"...'),
])
def test_values_are_quoted_as_json_spells_them_and_cut(value, text):
    assert quoted(value) == text


def test_names_are_listed_the_first_few_then_how_many_more():
    """One wording for every list a message cuts short (the inputs a request missed, the compile
    cache's entries swept, a folder's files): no comma before "and", the count in thousands."""
    assert listed_names(["a", "b"], 3) == "a, b"
    assert listed_names(iter(["a", "b", "c"]), 3) == "a, b, c"
    assert listed_names(["a", "b", "c", "d"], 3) == "a, b, c and 1 more"
    assert listed_names([f"m{i}" for i in range(1_002)], 2) == "m0, m1 and 1,000 more"
    assert listed_names(["a, b", "c"], quote=True) == "'a, b', 'c'"
    assert listed_names(["x" * (MAX_QUOTED_NAME + 2), "y", "z"], 2, quote=True) == \
        f"'{'x' * MAX_QUOTED_NAME}'... (2 more characters), 'y' and 1 more"


def decode_error(doc) -> str:
    raw = json.dumps(doc).encode()
    with pytest.raises(InvalidInput) as e:
        codec.decode_request(raw, len(raw), SIG)
    return str(e.value)


ONE_ROW = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}


def test_a_parameter_of_many_items_is_named_by_its_size_not_written_out():
    message = decode_error({"inputs": [ONE_ROW], "parameters": {"priority": [[]] * 200_000}})
    assert message == ("parameters.priority must be an unsigned 64-bit integer (at most 18446744073709551615), "
                       "got an array of 200,000 items")


def test_a_datatype_is_quoted_in_json_not_python():
    assert 'datatype true does not match' in decode_error({"inputs": [dict(ONE_ROW, datatype=True)]})
    assert 'got "soon"' in decode_error({"inputs": [ONE_ROW], "parameters": {"priority": "soon"}})
    # a string of digits out of range is quoted as the string it was (it read as a number)
    assert decode_error({"inputs": [ONE_ROW], "parameters": {"timeout": "9" * 20}}).endswith(f'got "{"9" * 20}"')
