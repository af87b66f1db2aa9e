"""Numbers (and booleans: below) YAML 1.1 reads otherwise than they look. PyYAML follows YAML
1.1, where an integer with a leading zero is octal (`port: 07000` is 3584; `0800`, not octal,
is text) and digits grouped by `:` are base 60 (`1:30` is 90, `1:30.5` is 90.5): an operator
who wrote 07000 meant 7000, or made a typo. A config file's plain scalar of these forms is refused where it is
(files.py), naming its key and what to write instead; one that came as text (quoted, or 0800)
is explained by the value checks (checks.py). Read as they look, and taken: 0 itself, the 0x
and 0b prefixes (hexadecimal and binary, as written), `_` between digits (1_000 is 1000) and
floats (0.5, 00.5); YAML 1.1 has no 0o prefix (0o17 is text).
Booleans alike: YAML 1.1 reads the words yes, no, on and off (each as yes, Yes or YES) as true
or false, so `country: NO` or `name: no` became False and a key `on:` the key True without a
word; a plain scalar of them is refused the same way. Only true and false (in PyYAML's three
cases) are taken as booleans; y and n are text to PyYAML."""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Iterator

import yaml

from .keys import KEYS_OF
from .schema import ConfigError, ModelConfig, ServerConfig

MISREAD = "tag:aclserve,2024:misread-number"  # the tag the loader gives such a scalar (never constructed)
MISREAD_BOOLEAN = "tag:aclserve,2024:misread-boolean"  # ... and a word YAML 1.1 reads as a boolean
_BOOLEAN_TAG = "tag:yaml.org,2002:bool"
_BOOLEANS_AS_WRITTEN = {"true", "True", "TRUE", "false", "False", "FALSE"}
_TRUE_WORDS = {"yes", "on"}  # (lower-cased; the others are no and off)
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_MERGE = "tag:yaml.org,2002:merge"
_LEADING_ZERO = re.compile(r"([-+]?)0([0-9_]*[0-9][0-9_]*)")  # (a digit after the zero: 0_ is 0)
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_OCTAL_PREFIX = re.compile(r"([-+]?)0o([0-7_]*[0-7][0-7_]*)")
_LONGEST_SHOWN = 30  # a longer scalar is named by its start, and no value is worked out for it


def resolved(tag: str, text: str) -> str:
    """The tag of a plain scalar `text` YAML resolved as `tag`: MISREAD for a number that does
    not read as it looks, MISREAD_BOOLEAN for a boolean not written true or false."""
    if tag in _NUMBER_TAGS and (_LEADING_ZERO.fullmatch(text) or _BASE_60.fullmatch(text)):
        return MISREAD
    if tag == _BOOLEAN_TAG and text not in _BOOLEANS_AS_WRITTEN:
        return MISREAD_BOOLEAN
    return tag


def advice(text: str) -> str | None:
    """What YAML 1.1 makes of `text` and what to write instead, if it is one of the forms above;
    else None."""
    long = len(text) > _LONGEST_SHOWN
    if long and _LEADING_ZERO.fullmatch(text):
        return f"{_shown(text)} has a leading zero (octal or text in YAML 1.1): write it without the zero"
    if long and _BASE_60.fullmatch(text):
        return f"{_shown(text)} is base 60 or text in YAML 1.1: write one plain number"
    if long:
        return None
    if match := _LEADING_ZERO.fullmatch(text):
        sign, digits = match[1].replace("+", ""), match[2].replace("_", "")
        decimal = sign + digits.lstrip("0") if digits.strip("0") else "0"
        if set(digits) <= set("01234567"):
            return f"{text} has a leading zero, which YAML 1.1 reads as octal ({sign}{int(digits, 8)}): write {decimal}"
        return f"{text} has a leading zero, which YAML 1.1 reads as text, and 0700 as octal: write {decimal}"
    if _BASE_60.fullmatch(text):
        number = yaml.safe_load(text)
        if isinstance(number, (int, float)):
            return f"{text} is base 60 in YAML 1.1 ({number}): write one plain number"
        return f"{text} is text in YAML 1.1, which reads 1:30 as base 60: write one plain number"
    if match := _OCTAL_PREFIX.fullmatch(text):
        return f"{text} is text in YAML 1.1, which has no 0o prefix: write " \
               f"{match[1].replace('+', '')}{int(match[2].replace('_', ''), 8)}"
    return None


def _boolean_keys(section, holder: str = "") -> Iterator[str]:
    """The keys of the dataclass `section` that take a boolean, as their dotted paths end: a
    field of bool (or bool | str) type that is a YAML key of the section (keys.KEYS_OF; a field no
    key sets, batch_from_pbtxt, is none), named under `holder`, the key of the section holding it,
    when there is one (`batching.enabled`; a section in a mapping of names or levels, an input's
    `image`, a priority level's policy, is named by its own fields)."""
    hints = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
        if field.name not in KEYS_OF.get(section, ()):
            continue
        kinds = _kinds(hints[field.name])
        if bool in kinds:
            yield f"{holder}.{field.name}" if holder else field.name
        for kind, named in kinds.items():
            if dataclasses.is_dataclass(kind):
                yield from _boolean_keys(kind, field.name if named else "")


def _kinds(hint) -> dict:
    """{type: whether a key names it directly} of what a field of type `hint` holds: each of a
    union's types (`ImageInput | None`), a mapping's values (not named by the field: by a name or a level)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return {kind: True for kind in typing.get_args(hint)}
    if typing.get_origin(hint) is dict:
        return {typing.get_args(hint)[1]: False}
    return {hint: True}


# the keys that take a boolean, as their dotted paths end (a server config's; a model's, in its own
# file or under model_defaults; `image.invert` also takes auto): such a word is offered as the boolean
# there, and quoted as text for every other key (it offered the boolean to text keys too, `host: NO`,
# `trace: {level: OFF}`, which refuse it, and text to these, which refuse that: testers, t92). Read
# from the schema's bool fields that are keys, and `version_policy.all` (also null), a choice the schema
# holds as a tuple. (A bool field no key sets, batch_from_pbtxt, was offered the boolean, then refused.)
BOOLEAN_KEYS = tuple(dict.fromkeys([*_boolean_keys(ServerConfig), *_boolean_keys(ModelConfig),
                                    "version_policy.all"]))


# those whose last key the config reads in any case, as every named choice: a version_policy's kind
# (config/model.py; `{ALL: yes}` was told to quote yes, which `all` refuses, where `{ALL: true}` is taken)
_LAST_IN_ANY_CASE = ("version_policy.all",)


def takes_boolean(path: str) -> bool:
    """Whether the value at the dotted `path` is one of BOOLEAN_KEYS, as the config reads its keys."""
    return any(_matches(path, key, key in _LAST_IN_ANY_CASE) for key in BOOLEAN_KEYS)


def miscased_boolean_key(path: str) -> str | None:
    """The one of BOOLEAN_KEYS the dotted `path` names in another case only (`batching.Enabled`,
    which the config refuses as an unknown key), else None."""
    if takes_boolean(path):
        return None
    return next((key for key in BOOLEAN_KEYS if _matches(path.lower(), key)), None)


def _matches(path: str, key: str, last_in_any_case: bool = False) -> bool:
    """Whether the dotted `path` ends with the dotted `key` (its last part in any case if so asked)."""
    parts, wanted = path.split("."), key.split(".")
    tail = parts[len(parts) - len(wanted):] if len(parts) >= len(wanted) else None
    if tail is None or tail[:-1] != wanted[:-1]:
        return False
    return tail[-1] == wanted[-1] or last_in_any_case and tail[-1].lower() == wanted[-1]


def boolean_advice(text: str, boolean: bool = False, spelled: str | None = None) -> str:
    """What YAML 1.1 makes of the word `text` (yes, no, on, off) and what to write instead: the
    boolean it was read as for a key that takes one (`boolean`), or for the key of BOOLEAN_KEYS the
    value's is in another case (`spelled`, that key spelled right), else the word quoted (text,
    which a key of numbers refuses in its own words)."""
    value = "true" if text.lower() in _TRUE_WORDS else "false"
    said = f"{_shown(text)} is a boolean in YAML 1.1 ({value})"
    if spelled is not None:  # (quoted, the word was refused next as under an unknown key)
        return f"{said}, and the key is {spelled}, in lower case (keys are case-sensitive): write {spelled}: {value}"
    return f"{said}: write {value}" if boolean else f'{said}: write "{_shown(text)}" in quotes'


def refuse_misread(root: yaml.Node) -> None:
    """Raise ConfigError naming the first scalar under `root` (in the file's order) tagged
    MISREAD or MISREAD_BOOLEAN by its key's dotted path. Each node is visited once, however many aliases name it
    (an alias bomb stays cheap)."""
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, str, bool]] = [(root, "", False)]  # (node, its path, whether it is a key)
    while todo:
        node, path, is_key = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                todo += [(value, _value_path(path, key), False), (key, path, True)]
        elif isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{path}[{i}]", False) for i, item in reversed(list(enumerate(node.value)))]
        elif node.tag in (MISREAD, MISREAD_BOOLEAN):
            if node.tag == MISREAD:
                said = f"{advice(node.value)}, or \"{_shown(node.value)}\" in quotes for text"
            else:
                said = boolean_advice(node.value, not is_key and takes_boolean(path),
                                      None if is_key else miscased_boolean_key(path))
            raise ConfigError(path, f"the key {said}" if is_key else said)


def _value_path(path: str, key: yaml.Node) -> str:
    """The dotted path of the value under `key` in the mapping at `path`: a `<<` merge's (and a
    key that is no scalar's) is the mapping's own."""
    if key.tag == _MERGE or not isinstance(key, yaml.ScalarNode):
        return path
    return f"{path}.{key.value}" if path else key.value


def _shown(text: str) -> str:
    return text if len(text) <= _LONGEST_SHOWN else text[:_LONGEST_SHOWN] + "..."
