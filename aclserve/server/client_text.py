"""A client's text bound for a log line or an answer: cut at a bound first, marked so that a
reader knows, then its unprintable characters replaced, at C speed.

Cut first, because whatever follows costs by the character: a gRPC model_name of 7 MiB of
'\\x01' with the request log on held the event loop 0.9 s a request (escaped one character at a
time in Python) and wrote it whole, twice, into a 14.7 MB log line.
"""
from __future__ import annotations

import re


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def printable(text: str, limit: int) -> str:
    """`text` cut at `limit` characters, anything unprintable in it (what str.isprintable
    refuses: controls, separators but the space, format characters such as bidi overrides,
    unassigned code points) replaced by '?'."""
    text = cut(text, limit)
    if text.isprintable():
        return text
    text = _UNPRINTABLE_BMP.sub("?", text)
    if _ASTRAL.search(text) is None:
        return text
    return _ASTRAL.sub(lambda m: m[0] if m[0].isprintable() else "?", text)


def _bmp_class() -> str:
    """A regex class of the Basic Multilingual Plane's unprintable characters, as this Python's
    Unicode tables say (a class of BMP characters only is a bitmap to the regex engine; one
    with astral ranges is a list it walks for every character, 0.7 us each)."""
    ranges, start = [], None
    for code in range(0x10000):
        if not chr(code).isprintable():
            if start is None:
                start = code
        elif start is not None:
            ranges.append((start, code - 1))
            start = None
    if start is not None:
        ranges.append((start, 0xFFFF))
    return "[" + "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges) + "]"


_UNPRINTABLE_BMP = re.compile(_bmp_class())
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # (rare: each is checked by itself)
