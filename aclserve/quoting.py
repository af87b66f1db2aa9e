"""A client's value as an error message quotes it: in JSON's spelling (true, null, "text"), not
Python's (True, None, 'text'), and bounded: a string cut at MAX_QUOTED characters (a name at
MAX_QUOTED_NAME, in single quotes: quoted_name), an array or an object named by its size instead
of written out (a refusal of a priority sent as an array of a million items spent 40 ms of the
event loop writing them, and the message was then cut anyway). A list of names a message gives is
bounded alike: its first few, then how many more (listed_names). A number of things is written as every
message writes it (counted)."""
from __future__ import annotations

import math
from typing import Iterable

import orjson

MAX_QUOTED = 40
MAX_QUOTED_NAME = 256  # characters of a client's name a message quotes (a model's own are at most 128)
MAX_LISTED_NAMES = 16  # a model's names a message lists (an exported graph may have hundreds of inputs)


def quoted(value) -> str:
    kind = type(value)
    if kind is list or kind is dict:
        if not value:
            return "[]" if kind is list else "{}"
        return (f"an array of {counted(len(value), 'item')}" if kind is list
                else f"an object of {counted(len(value), 'key')}")
    if kind is str:
        return orjson.dumps(value[:MAX_QUOTED]).decode() + ("..." if len(value) > MAX_QUOTED else "")
    if kind is float and not math.isfinite(value):
        if math.isnan(value):  # (gRPC: a double parameter may carry one)
            return "NaN"
        return "a number beyond a double's range"  # the stdlib decoder reads 1e400 as inf
    if kind is int and not -2**63 <= value < 2**64:
        return quoted_integer(str(value))  # (the decoder refuses more than 4,300 digits)
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # not a JSON value (gRPC's parameters hand over protobuf scalars as such)
        return repr(value)[:MAX_QUOTED]


def quoted_integer(digits: str) -> str:
    """An integer written out (`-` and digits): as it is, or its number of digits when long."""
    return digits if len(digits) <= MAX_QUOTED else f"an integer of {len(digits.lstrip('-')):,} digits"


def quoted_name(name: str) -> str:
    """A client's name (an input's, an output's) in single quotes, as a message quotes a name:
    cut at MAX_QUOTED_NAME characters, with how many more there were, so that the message's own
    words after it stay (the model's names). A cut of the whole message (redact.MAX_TEXT,
    grpc_status.fit_status_message) took them off and counted what it cut of a text already cut:
    "... (4,187 more characters)" of a 10,000-character name over gRPC."""
    if len(name) <= MAX_QUOTED_NAME:
        return f"'{name}'"
    return f"'{name[:MAX_QUOTED_NAME]}'... ({len(name) - MAX_QUOTED_NAME:,} more characters)"


def listed_names(names: Iterable[str], shown: int = MAX_LISTED_NAMES, quote: bool = False) -> str:
    """Names as a message lists them, "a, b, c and 5 more": the first `shown`, then how many more
    there are (a folder of 160 cache entries, a graph of hundreds of inputs: one line each).
    `quote`: each quoted as quoted_name quotes a client's, for names that may hold a comma or a
    blank (a model's inputs "a, b" and "c" read as three unquoted)."""
    names = list(names)
    listed = ", ".join(quoted_name(name) if quote else name for name in names[:shown])
    rest = len(names) - shown
    return f"{listed} and {rest:,} more" if rest > 0 else listed


def counted(n: int, noun: str) -> str:
    """'1 item', '0 items', '12,928 requests': a number of things as every message writes it (a plural
    in -s)."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")
