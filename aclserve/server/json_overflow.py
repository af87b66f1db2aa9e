"""The stdlib decoder, for a JSON body orjson refuses only for a number beyond a double (1e400):
it reads the overflow as inf, which the check of the tensor it lands in refuses, naming that
input (json_tensors.loads calls it on that error path only). What orjson refuses besides, the
stdlib must refuse too: NaN/Infinity literals, and a lone surrogate escape ("\\ud800"), which
the stdlib takes into a string that orjson then cannot write back (a 500)."""
from __future__ import annotations

import json
import re
import sys

from ..errors import InvalidInput


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (send non-finite numbers with the binary tensor extension)")


def _int_as_orjson_reads_it(text: str):
    """An integer beyond 64 bits becomes a float in orjson (refused or rounded by the tensor's
    checks as on its path); the stdlib's own limit, 4,300 digits, is said in our words."""
    if len(text) > 4300:
        raise ValueError(f"an integer of {len(text):,} digits")
    value = int(text)
    return value if -2**63 <= value < 2**64 else float(value)


_stdlib = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_int_as_orjson_reads_it)
MAX_DEPTH = 1024  # orjson's nesting limit, which every path keeps


def loads_keeping_overflow(raw: bytes | memoryview):
    """The stdlib decoder reads an overflowing number as inf (which the checks of the field it
    lands in refuse, naming the field); orjson refuses the whole document instead. The stdlib
    also takes a lone surrogate escape ("\\ud800") into a string, which orjson refuses and cannot
    write back: an error message or answer quoting that string (an input's name, the request id)
    would fail as a 500, so it is refused here as orjson refuses it."""
    try:
        text = bytes(raw).decode("utf-8")
        doc = _decode_nested(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidInput("request body is not valid JSON: nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text):  # (raw surrogate bytes are invalid UTF-8: refused above)
        _refuse_lone_surrogates(doc)
    return doc


def _decode_nested(text: str):
    """The stdlib parses as deep as the interpreter's recursion limit less its caller's own depth,
    which differs from one HTTP path to the other: it is given room for MAX_DEPTH levels
    wherever it is called from, and deeper documents are refused as orjson refuses them."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + MAX_DEPTH + 64)
    try:
        doc = _stdlib.decode(text)
    finally:
        sys.setrecursionlimit(limit)
    stack = [(doc, 1)] if type(doc) in (list, dict) else []
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RecursionError
        children = value.values() if type(value) is dict else value
        if type(value) is dict or not _NUMBERS.issuperset(map(type, value)):  # (numbers passed over in C)
            stack.extend((v, depth + 1) for v in children if type(v) in (list, dict))
    return doc


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a \ud800-\udfff escape, or text that looks like one


_NUMBERS = frozenset({int, float, bool, type(None)})


def _refuse_lone_surrogates(doc) -> None:
    """InvalidInput when a key or string of the parsed `doc` holds a lone surrogate (no
    recursion: the stdlib parses up to the interpreter's recursion limit)."""
    stack = [doc]
    while stack:
        value = stack.pop()
        if type(value) is dict:
            stack.extend(value)
            stack.extend(value.values())
        elif type(value) is list:
            if not _NUMBERS.issuperset(map(type, value)):  # (a list of numbers is passed over in C)
                stack.extend(v for v in value if type(v) in (str, list, dict))
        elif type(value) is str and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput("request body is not valid JSON: a string holds a lone surrogate "
                                   "(a \\ud800-\\udfff escape without its pair)") from None
