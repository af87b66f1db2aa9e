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
    digits = len(text) - text.startswith("-")
    if digits > 4300:
        raise ValueError(f"an integer of {digits:,} digits")
    value = int(text)
    # (from the text: float() of an int beyond a double raises OverflowError; of the text it is
    # inf, as the stdlib reads 1e400)
    return value if -2**63 <= value < 2**64 else float(text)


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
        raise InvalidInput(_TOO_DEEP) from None
    # (raw surrogate bytes are invalid UTF-8: refused above)
    _check_parsed(doc, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return doc


def _decode_nested(text: str):
    """The stdlib parses as deep as the interpreter's recursion limit less its caller's own depth,
    which differs from one HTTP path to the other: it is given room for MAX_DEPTH levels
    wherever it is called from (_check_parsed refuses deeper documents as orjson does)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + MAX_DEPTH + 64)
    try:
        return _stdlib.decode(text)
    finally:
        sys.setrecursionlimit(limit)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a \ud800-\udfff escape, or text that looks like one


_NUMBERS = frozenset({int, float, bool, type(None)})
_TOO_DEEP = "request body is not valid JSON: nested too deeply"


def _check_parsed(doc, strings: bool) -> None:
    """One walk of the parsed `doc` (no recursion), a list of numbers passed over in C:
    InvalidInput past MAX_DEPTH levels, and with `strings` when a key or string holds a lone
    surrogate (said only once the depth has passed, as orjson would refuse the depth first)."""
    walked = (str, list, dict) if strings else (list, dict)
    lone = False
    stack = [(doc, 1)] if type(doc) in walked else []
    while stack:
        value, depth = stack.pop()
        if type(value) is str:
            lone = lone or (not value.isascii() and not _encodes(value))
            continue
        if depth > MAX_DEPTH:
            raise InvalidInput(_TOO_DEEP)
        if type(value) is dict:
            children = [*value, *value.values()] if strings else value.values()
        elif _NUMBERS.issuperset(map(type, value)):
            continue
        else:
            children = value
        stack.extend((v, depth + 1) for v in children if type(v) in walked)
    if lone:
        raise InvalidInput("request body is not valid JSON: a string holds a lone surrogate "
                           "(a \\ud800-\\udfff escape without its pair)")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
