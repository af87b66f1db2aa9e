"""Value checks shared by the section parsers: each returns the value or raises ConfigError
naming the key's dotted path."""
from __future__ import annotations

import datetime
import math
import reprlib
from typing import Mapping

import yaml

from .schema import AUTO, ConfigError
from .yaml_numbers import advice


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 80, 80, 40


def shown(value) -> str:
    """A value as a message quotes it: bounded in length and depth. Its plain repr() walked a
    YAML alias bomb (a 420-byte file whose list holds a billion strings through aliases)."""
    return _SHOWN.repr(value)


def unless_none(value, default):
    """`value`, or `default` when the key is absent or null: not `value or default`, which took
    a wrong type's false value (api_token: false, tls_cert_file: [], images: []) for none."""
    return default if value is None else value


def key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def is_auto(value) -> bool:
    """`auto` in any case, as a named choice is taken (`max_queue_size: AUTO`)."""
    return isinstance(value, str) and value.lower() == AUTO


def as_mapping(value, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, got {shown(value)}")
    return value


def no_unknown(data: Mapping, known, path: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(key_path(path, _key_shown(key)), f"unknown key (known: {', '.join(sorted(known))})")


def _key_shown(key) -> str:
    """An unknown key as its error names it: as written when it is a short printable string, else
    quoted and bounded (a newline in it split the error's log line in two; a key of a megabyte
    was the whole message)."""
    text = str(key)
    return text if text.isprintable() and len(text) <= 80 else shown(text)


# the longest duration in milliseconds a setting may hold: pyACL's timeouts take a C int (24.8 days)
MAX_MS = 2**31 - 1


def as_int(value, path: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, got {shown(value)}{_yaml_hint(value)}")
    if minimum is not None and value < minimum:
        raise ConfigError(path, f"must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(path, f"must be <= {maximum}, got {shown(value)}")
    return value


def as_float(value, path: str, minimum: float | None = 0.0, below: float | None = None,
             maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"must be a number, got {shown(value)}{_yaml_hint(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer past the largest float
        raise ConfigError(path, f"must be a number (at most 1.8e+308), got {shown(value)}") from None
    if not math.isfinite(number):
        raise ConfigError(path, f"must be a number, got {shown(value)}")
    # (the bound at :.10g, where :g's 6 digits read one and a value just past it the same; the
    # value as it was written: 99999999999 read "1e+11" at :.10g)
    if minimum is not None and number < minimum:
        raise ConfigError(path, f"must be >= {minimum:.10g}, got {shown(value)}")
    if below is not None and number >= below:
        raise ConfigError(path, f"must be < {below:.10g}, got {shown(value)}")
    if maximum is not None and number > maximum:
        raise ConfigError(path, f"must be <= {maximum:.10g}, got {shown(value)}")
    return number


_PLAIN = yaml.resolver.Resolver()  # what YAML makes of a scalar written without quotes
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _yaml_hint(value) -> str:
    """Why a number came as text: quoted (a Helm template's habit: "10", "0.25", which YAML
    reads as numbers without the quotes), or YAML 1.1 (PyYAML) reading 1e9 as text (a float
    needs its dot and the exponent's sign: 1.0e+9); a leading zero, base 60 or 0o, which YAML
    1.1 reads otherwise than they look, quoted or not (yaml_numbers.py: the file refuses them
    unquoted when they read as numbers), are said as such."""
    if not isinstance(value, str):
        return ""
    said = advice(value.strip())
    if said:
        return f" ({said})"
    if _PLAIN.resolve(yaml.ScalarNode, value.strip(), (True, False)) in _NUMBER_TAGS:
        return " (a number in quotes is text: write it without quotes)"
    try:
        float(value)
    except ValueError:
        return ""
    return " (YAML reads a number like 1e9 as text: write 1000000000, or 1.0e+9 for a non-integer)"


def as_bool(value, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be true or false, got {shown(value)}")
    return value


def as_str(value, path: str, choices=None, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        hint = text_hint(value) if choices is None else ""  # (quoted, 10 would be no choice either)
        raise ConfigError(path, f"must be a {'non-empty ' if not allow_empty else ''}string, got {shown(value)}{hint}")
    if choices is not None and value not in choices:
        same = [c for c in choices if c.lower() == value.lower()]  # any case, as ACLSERVE_DEVICE (log_level: INFO)
        if not same:
            raise ConfigError(path, f"must be one of {', '.join(choices)}, got {shown(value)}")
        value = same[0]
    if "\x00" in value:  # no path or name holds one (TLS files: a ValueError traceback at start)
        raise ConfigError(path, "must not contain a NUL character")
    return value


def text_hint(value) -> str:
    """Why text came as another type: YAML reads a date (`host: 2001-12-14` was "got
    datetime.date(2001, 12, 14)"), a number (`models_dir: 2024`) or a boolean (`api_token: true`)
    written without quotes as one."""
    if isinstance(value, datetime.date):  # (a datetime too: 2001-12-14 10:00:00)
        return " (YAML reads it as a date: write it in quotes for text)"
    if isinstance(value, bool):  # (`api_token: true` said only "must be a string": a tester, t84)
        return " (YAML reads it as a boolean: write it in quotes for text)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return " (YAML reads it as a number: write it in quotes for text)"
    return ""


def as_opt_str(value, path: str) -> str | None:
    return None if value is None else as_str(value, path, allow_empty=False)


def int_list(value, path: str, minimum: int = 0, non_empty: bool = True) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or (non_empty and not value):
        raise ConfigError(path, f"must be a {'non-empty ' if non_empty else ''}list of integers, got {shown(value)}")
    items = tuple(as_int(v, f"{path}[{i}]", minimum) for i, v in enumerate(value))
    if len(set(items)) != len(items):
        raise ConfigError(path, f"has duplicates: {list(items)}")
    return items


def numbers(value, path: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:  # (how many: the caller's rule, image_values.py's)
        raise ConfigError(path, f"must be a number or a list of numbers, got {shown(value)}")
    return tuple(as_float(v, f"{path}[{i}]", None) for i, v in enumerate(value))
