"""pyACL's argument parsing: wrong arity or type raises TypeError("<api> args parse failed").

pyACL parses with PyArg_ParseTuple, so ints accept anything with __index__ (numpy ints, bool)
but not floats or None, strings must be str, and keyword arguments are not accepted.
"""
from __future__ import annotations

import functools
import operator

INT = "int"
STR = "str"
FUNC = "callable"
ANY = "any"
TUPLE = "tuple"


def _convert(kind, value, msg):
    if kind is INT:
        if type(value) is int:
            return value
        try:
            return operator.index(value)
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


def api(name: str, *kinds: str, optional: int = 0):
    """Decorate a pyACL function taking positional arguments of the given kinds."""
    count, least = len(kinds), len(kinds) - optional
    msg = f"{name} args parse failed"
    all_int = all(k is INT for k in kinds)

    def wrap(fn):
        if all_int:
            @functools.wraps(fn)
            def int_wrapper(*args, **kwargs):
                if kwargs or not least <= len(args) <= count:
                    raise TypeError(msg)
                for a in args:
                    if type(a) is not int:
                        args = tuple(_convert(INT, v, msg) for v in args)
                        break
                return fn(*args)
            return int_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if kwargs or not least <= len(args) <= count:
                raise TypeError(msg)
            return fn(*(_convert(k, a, msg) for k, a in zip(kinds, args)))
        return wrapper
    return wrap
