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
