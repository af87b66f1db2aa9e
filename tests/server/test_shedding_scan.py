"""shedding.may_name_priority: the early refusal's look for a priority in a body's JSON, which
must find every spelling the codec would read (else a request of another level is refused as
the default level's) while not searching a body of numbers twice over."""
import json

from aclserve.server.shedding import _Y_LOOKS, may_name_priority

NUMBERS = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4096],
                                  "data": [0.125] * 4096}]}).encode()


def test_a_body_of_numbers_names_no_priority():
    assert not may_name_priority(NUMBERS)
    assert not may_name_priority(b"")


def test_priority_is_found_wherever_the_body_names_it():
    first = json.dumps({"parameters": {"priority": 1}, "inputs": []}).encode()
    last = NUMBERS[:-1] + b',"parameters":{"priority":1}}'
    assert may_name_priority(first) and may_name_priority(last)
    assert may_name_priority(b"priority")  # at the very start: no bytes before its 'p'


def test_an_escape_that_could_spell_priority_counts_as_naming_it():
    assert may_name_priority(json.dumps({"parameters": {"pr\u0069ority": 1}}, ensure_ascii=False)
                             .replace("i", "\\u0069", 1).encode())
    assert may_name_priority(b'{"a": "\\n"}')


def test_past_the_ys_looked_at_one_by_one_the_whole_body_is_searched():
    many = b'"' + b"y" * (_Y_LOOKS * 4) + b'"'
    assert not may_name_priority(many + NUMBERS)
    assert may_name_priority(many + b',"priority":1')
    near_misses = b"priorit" * 10 + b"y" * 3 + b"xpriority"
    assert may_name_priority(near_misses)


def test_the_id_of_a_request_refused_undecoded_is_the_one_its_decode_would_read():
    """shedding.stated_id: the top-level "id" (the last of repeated ones, as orjson keeps it), not
    one in a nested object nor a string value "id"; none for a JSON part over ID_READ_BYTES,
    one that does not parse, or an id that is not a string (its decode would refuse it, naming none)."""
    from aclserve.server.json_limits import JsonLimits
    from aclserve.server.shedding import ID_READ_BYTES, stated_id
    limits = JsonLimits()
    assert stated_id(b'{"id": "r-1", "inputs": []}', None, limits) == "r-1"
    assert stated_id(b'{"parameters": {"id": "nested"}, "inputs": [{"name": "id"}]}', None, limits) is None
    assert stated_id(b'{"id": "first", "inputs": [], "id": "last"}', None, limits) == "last"
    assert stated_id(b'{"id": "r\\u002d1"}', None, limits) == "r-1"
    assert stated_id(b'{"id": 7}', None, limits) is None and stated_id(b'["id"]', None, limits) is None
    assert stated_id(b'{"id": "r-1", "inputs": [', None, limits) is None
    framed = b'{"id": "bin-1"}'
    assert stated_id(framed + b"\x00\xff" * 8, len(framed), limits) == "bin-1"
    assert stated_id(framed, len(framed) + 1, limits) is None  # a header past the body: refused when decoded
    assert stated_id(framed + b" " * ID_READ_BYTES, None, limits) is None  # the decode the refusal saves
