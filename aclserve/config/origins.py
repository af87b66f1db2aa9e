"""Where each setting of a server config came from (an override, the config file, the embedded
default), for its errors to say: an error about one key is blamed on its source, one about
settings that do not go together (schema.ConfigConflict) names the source of each."""
from __future__ import annotations

import os
import re
from typing import Callable, Mapping

from .schema import ConfigConflict, ConfigError

COMMAND_LINE = "command line"  # the source a bad override is blamed on (ConfigError.source)
DEFAULT = "the default"  # the embedded default's (aclserve/configs/default.yaml)
MODEL_DEFAULTS = "model_defaults"  # a model's setting its file does not give, the server config's origins unknown
_INDEX = re.compile(r"\[\d+\]$")  # a list item's path (model_defaults.devices[1]): the list's key


class Origins:
    """The layers a server config was merged from: the file at `path` (its mapping `file_data`)
    and `overrides` (dotted or nested keys; None values are not given), each override made by the
    command-line flag `flags` names for its key (`{"port": "--port"}`), when one does."""

    def __init__(self, path: str | os.PathLike | None = None, file_data: Mapping | None = None,
                 overrides: Mapping | None = None, flags: Mapping[str, str] | None = None):
        self._path = None if path is None else str(path)
        self._file = file_data or {}
        self._overrides = {str(key): value for key, value in (overrides or {}).items() if value is not None}
        self._flags = dict(flags or {})

    def of(self, key: str) -> str:
        """Where the value of the dotted `key` came from: the flag that set it (`the command line`
        for an override no flag names), the config file's path, or `the default`."""
        override = self._override(key)
        if override is not None:
            return self._flags.get(override, f"the {COMMAND_LINE}")
        if self._path is not None and _holds(self._file, key):
            return self._path
        return DEFAULT

    def of_model_default(self, key: str) -> str:
        """Where model_defaults' `key` (a model's dotted key: batching.preserve_ordering) came from,
        as a model's conflict names it: the flag, `the server config's model_defaults (its path)`
        or `the default` (a model's file naming neither blamed itself for the defaults' values)."""
        origin = self.of(f"model_defaults.{key}")
        return f"the server config's model_defaults ({origin})" if origin == self._path else origin

    def blamed(self, error: ConfigError) -> ConfigError:
        """`error` with where its values came from. A conflict: the origin of each of its keys.
        Another: `command line` for a key an override set (a flag's bad value is not the file's:
        `--cpu-threads 0` was blamed on it), else the file; as it was when it names its source
        already, or when neither a file nor flags were given (the library's overrides alone: no
        source to tell them from). For the loader's errors and those found as the server starts (a
        TLS file that cannot be read, the API token: cli/serve.py)."""
        if isinstance(error, ConfigConflict):
            return error.with_origins(self.of)
        if error.source is not None or (self._path is None and not self._flags):
            return error
        if self._override(error.path):  # (`serve --port -1`, no file, named no source)
            return ConfigError(error.path, error.problem, COMMAND_LINE)
        return error if self._path is None else ConfigError(error.path, error.problem, self._path)

    def replaced(self) -> dict[str, list[str]]:
        """The dotted keys the config file gives that an override replaced, each with where its
        value came from (a flag, or `the command line`; several for a section): the override's
        key, or a section above it the file gives as no mapping, which the override's replaced
        whole (`model_defaults: []` under `--max-batch`: the list was dropped unchecked)."""
        origins: dict[str, list[str]] = {}
        for key in self._overrides:
            given = _replaced_in(self._file, key)
            if given is not None and self.of(key) not in origins.setdefault(given, []):
                origins[given].append(self.of(key))
        return origins

    def _override(self, key: str) -> str | None:
        """The override that set the key at dotted `key` (itself, a list holding it, or a
        mapping given whole that holds it), if any."""
        for given, value in self._overrides.items():
            if key == given or key.startswith(f"{given}["):
                return given
            if key.startswith(f"{given}.") and (not isinstance(value, Mapping) or _holds(value, key[len(given) + 1:])):
                return given
        return None


def model_origins(own: Mapping, path: str, defaults: Callable[[str], str] | None) -> Callable[[str], str]:
    """Where each setting of a model came from: its file at `path` when `own` (that file's mapping)
    gives it, else model_defaults' origin (`defaults`: ModelConfig.origin_of; model_defaults when
    unknown)."""
    return lambda key: path if _holds(own, key) else defaults(key) if defaults else MODEL_DEFAULTS


def _replaced_in(file: Mapping, key: str) -> str | None:
    """The dotted key of the config file's mapping `file` that an override of `key` replaced: `key`
    when the file gives it, or the first one above it the file gives as a value that is no mapping
    (a list, text, a number); None when the file gives neither (a null section is one left empty,
    which keeps what is below it: files.merge)."""
    if _holds(file, key):
        return key
    parts = _INDEX.sub("", key).split(".")
    for depth in range(1, len(parts)):
        above = ".".join(parts[:depth])
        given = found(file, above)
        if given is None or given[1] is None:
            return None
        if not isinstance(given[1], Mapping):
            return above
    return None


def _holds(data: Mapping, key: str) -> bool:
    """Whether the nested mapping `data` gives the dotted `key`."""
    return found(data, key) is not None


def found(data: Mapping, key: str) -> tuple[tuple, object] | None:
    """Where the nested mapping `data` gives the dotted `key`, as its own keys (a level number as
    YAML reads it, 2 or "2"; a list item's as its list), and the value there; None if it does not."""
    node: object = data
    keys: list = []
    for part in _INDEX.sub("", key).split("."):
        if not isinstance(node, Mapping):
            return None
        given = [k for k in (part, int(part) if part.isascii() and part.isdigit() else None)
                 if k is not None and k in node]
        if not given:
            return None
        keys.append(given[0])
        node = node[given[0]]
    return tuple(keys), node
