"""pyACL's argument parsing: wrong arity or type raises TypeError("<api> args parse failed").

pyACL parses with PyArg_ParseTuple, and the format letter decides what passes:
- PTR ("k"/"K", C unsigned long): pointers, sizes and handles. Only a real `int` (or a subclass,
  so `bool`) passes: a `numpy.int64` raises TypeError. Negative values are not refused but
  wrapped to 64 bits, as PyLong_AsUnsignedLongMask does (-1 becomes 2**64 - 1).
- INT ("i", C int): enums, indices, ids, timeouts. Anything with __index__ passes (numpy ints,
  bool), floats and None do not; a value outside the C int range raises OverflowError.
- U32 ("I", C unsigned int): widths, heights, strides and sizes of acl.media. Anything with
  __index__ passes, floats and None do not; the value is wrapped to 32 bits, not refused, as
  PyLong_AsUnsignedLongMask does for "I".
Strings must be str, and keyword arguments are not accepted.
"""
from __future__ import annotations

import functools
import operator

INT = "int"
PTR = "ptr"
U32 = "uint32"
STR = "str"
FUNC = "callable"
ANY = "any"
TUPLE = "tuple"

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def _convert(kind, value, msg):
    if kind is PTR:
        if isinstance(value, int):
            return int(value) & _U64
        raise TypeError(msg)
    if kind is INT:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(msg) from None
        if not _INT_MIN <= value <= _INT_MAX:
            raise OverflowError(f"{msg}: signed integer {value} out of the C int range")
        return value
    if kind is U32:
        try:
            return operator.index(value) & _U32
        except TypeError:
            raise TypeError(msg) from None
    if kind is STR:
        if isinstance(value, str):
            return value
        raise TypeError(msg)
    if kind is FUNC:
        if callable(value):
            return value
        raise TypeError(msg)
    if kind is TUPLE:
        if isinstance(value, tuple):
            return value
        raise TypeError(msg)
    return value


def _plain_ok(kinds, args) -> bool:
    """True when every argument is a plain int already in range for its kind (the hot path)."""
    for kind, a in zip(kinds, args):
        if type(a) is not int:
            return False
        if kind is PTR:
            if a < 0 or a > _U64:
                return False
        elif kind is U32:
            if a < 0 or a > _U32:
                return False
        elif not _INT_MIN <= a <= _INT_MAX:
            return False
    return True


def api(name: str, *kinds: str, optional: int = 0):
    """Decorate a pyACL function taking positional arguments of the given kinds."""
    count, least = len(kinds), len(kinds) - optional
    msg = f"{name} args parse failed"
    numeric = all(k is INT or k is PTR or k is U32 for k in kinds)

    def wrap(fn):
        if numeric:
            @functools.wraps(fn)
            def numeric_wrapper(*args, **kwargs):
                if kwargs or not least <= len(args) <= count:
                    raise TypeError(msg)
                if not _plain_ok(kinds, args):
                    args = tuple(_convert(k, v, msg) for k, v in zip(kinds, args))
                return fn(*args)
            return numeric_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if kwargs or not least <= len(args) <= count:
                raise TypeError(msg)
            return fn(*(_convert(k, a, msg) for k, a in zip(kinds, args)))
        return wrapper
    return wrap
