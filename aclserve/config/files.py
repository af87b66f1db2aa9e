"""Where configuration comes from: the embedded default, YAML files and overrides, deep-merged
in that order, then parsed (server.py, model.py)."""
from __future__ import annotations

import copy
import dataclasses
import os
import stat
from pathlib import Path
from typing import IO, Mapping

import yaml

from ..regular_files import open_regular
from .model import given_by_defaults, model_config_mapping, parse_model_config
from .origins import DEFAULT, Origins, found, model_origins
from .schema import AUTO, ConfigConflict, ConfigError, ConfigFileUnread, ModelConfig, ServerConfig
from .server import parse_server_config
from .yaml_numbers import refuse_misread, resolved

DEFAULT_CONFIG_PATH = Path(__file__).parent.parent / "configs" / "default.yaml"
_REPLACED_WHOLE = {"version_policy"}  # a later layer replaces these whole (a one-key choice)
# sections of settings, where null (every line under the key commented out) keeps what is there;
# elsewhere null is a value (`inputs: {x: {image: }}` turns an inherited image input off)
_SECTIONS = {"model_defaults", "images", "trace", "device_limits", "batching", "compile", "default_queue_policy"}
# The most a config file may hold. Settings take a few KB (the default config, every key documented:
# 41 KB); what a larger file costs is its parse, by the scan for a model's: PyYAML's reader is pure
# Python, about 5 s of CPU for 1 MB, the GIL held meanwhile (a tester's, parsed at every scan, took
# another model's p99 from 11 to 53 ms: t92); 256 KiB, about 1.4 s, once (repository/config_reads.py).
MAX_CONFIG_BYTES = 256 * 1024


def merge(base: Mapping, over: Mapping) -> dict:
    """Deep-merge `over` onto `base` (new dict; inputs untouched)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if value is None and key in _SECTIONS and isinstance(out.get(key), Mapping):
            continue  # a section left empty (its lines commented out) keeps what it would override
        if key in out and isinstance(out[key], Mapping) and isinstance(value, Mapping) \
                and key not in _REPLACED_WHOLE:
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _expand_dotted(overrides: Mapping) -> dict:
    """{"model_defaults.instances": 2} -> {"model_defaults": {"instances": 2}}; None values dropped."""
    nested: dict = {}
    for key, value in overrides.items():
        if value is None:
            continue
        parts = str(key).split(".")
        target = nested
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(str(key), "conflicting overrides")
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(target.get(last), dict):
            target[last] = merge(target[last], value)
        else:
            target[last] = value
    return nested


def read_yaml(path: str | os.PathLike, regular_only: bool = False) -> dict:
    """The mapping in the YAML file at `path`. `regular_only`: refuse a FIFO, socket or device
    node unopened (a model's config, read by every scan); a server config may be a pipe."""
    if not os.fspath(path):
        raise ConfigError("", "no config file given (an empty path)")
    try:
        with open_regular(path, "r", "utf-8") if regular_only else open(path, encoding="utf-8") as f:
            data = yaml.load(bounded_text(f, path), Loader=_UniqueKeyLoader)
    except OSError as e:
        raise ConfigFileUnread("", f"cannot read config file: {e.strerror}", str(path)) from None
    except ConfigError as e:  # a number or boolean YAML 1.1 reads otherwise than it looks (yaml_numbers.py)
        raise ConfigError(e.path, e.problem, str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"invalid YAML: {_yaml_problem(e)}", str(path)) from None
    except UnicodeDecodeError as e:  # e.g. saved in Latin-1
        raise ConfigError("", f"not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})", str(path)) from None
    except RecursionError:  # PyYAML's composer recurses once per level
        raise ConfigError("", "invalid YAML: nested too deeply", str(path)) from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts (4300)
        raise ConfigError("", f"invalid YAML: {' '.join(str(e).split(';')[0].split())[:200]}", str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"must be a mapping at the top level, got {type(data).__name__}", str(path))
    return data


def bounded_text(f: IO[str], path: str | os.PathLike) -> str:
    """The text of the config file `f` (opened from `path`), refused past MAX_CONFIG_BYTES by a
    ConfigError naming the file: a regular file by its size, from fstat, before anything is read (a
    tester's 28.7 MB YAML held the scan three minutes and took 2.7 GB); a pipe (a server config may
    be one) once that much is read."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        text = f.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError("", f"more than a config file may be ({_size_text(MAX_CONFIG_BYTES)})", str(path))
        return text
    if st.st_size > MAX_CONFIG_BYTES:
        size, limit = _size_text(st.st_size), _size_text(MAX_CONFIG_BYTES)
        if size == limit:  # (a few bytes over: "256 KiB, more than ... (256 KiB)" said nothing)
            size, limit = f"{st.st_size:,} bytes", f"{MAX_CONFIG_BYTES:,} bytes"
        raise ConfigError("", f"{size}, more than a config file may be ({limit})", str(path))
    return f.read()


def _size_text(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load's loader refusing a key written twice in one mapping (PyYAML keeps the last
    silently: a setting that looked set was not); keys brought in by a `<<` merge may be
    overridden, as YAML means them to be. Each mapping is checked as written, the first time
    PyYAML flattens it: flattening puts the merged keys in front of its own, in place.
    It refuses, before anything is built, a number or boolean YAML 1.1 reads otherwise than it
    looks (07000 octal, 1:30 base 60, yes true: yaml_numbers.py), naming its key (ConfigError
    without a source)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._checked: set[int] = set()  # id() of the mapping nodes checked (they live as long as the load)

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        return resolved(tag, value) if kind is yaml.ScalarNode and implicit[0] else tag

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        refuse_misread(node)
        return self.construct_document(node)

    def flatten_mapping(self, node):
        if id(node) not in self._checked:
            self._checked.add(id(node))
            self._refuse_twice_given(node)
        super().flatten_mapping(node)

    def _refuse_twice_given(self, node) -> None:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base refuses it in its own words
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"the key {key!r} is given twice",
                    key_node.start_mark)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error in one line (its own text spans four, naming the file twice)."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(e).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    context, started = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and started is not None:
        return f"{where}: {problem} ({context} at line {started.line + 1}, column {started.column + 1})"
    return f"{where}: {problem}"


def default_mapping() -> dict:
    return read_yaml(DEFAULT_CONFIG_PATH)


def load_server_config(path: str | os.PathLike | None = None, overrides: Mapping | None = None) -> ServerConfig:
    """Embedded default <- YAML file at `path` <- `overrides` (nested or dotted keys; None values
    are ignored so argparse defaults of None fall through). Raises ConfigError."""
    return load_server_settings(path, overrides)[0]


def load_server_settings(path: str | os.PathLike | None = None, overrides: Mapping | None = None,
                         flags: Mapping[str, str] | None = None) -> tuple[ServerConfig, Origins]:
    """load_server_config's config, and where each of its settings came from (`flags`: the
    command-line flag of each override's key), for the errors found as the server starts.
    Raises ConfigError blamed on the source of the values it is about (Origins.blamed)."""
    merged, data = default_mapping(), {}
    if path is not None:
        data = read_yaml(path)
        merged = merge(merged, data)
    if overrides:
        merged = merge(merged, _expand_dotted(overrides))
    origins = Origins(path, data, overrides, flags)
    given = lambda key: origins.of(key) != DEFAULT  # noqa: E731
    try:
        config = parse_server_config(merged, given=given)
    except ConfigError as e:
        raise origins.blamed(e) from None
    if path is not None:
        _check_replaced(merged, data, origins, given, str(path))
    defaults = dataclasses.replace(config.model_defaults, origin_of=origins.of_model_default)
    return dataclasses.replace(config, model_defaults=defaults), origins


def _check_replaced(merged: dict, data: Mapping, origins: Origins, given, path: str) -> None:
    """Refuse a value of the file at `path` (its mapping `data`) that an override replaced in `merged`
    (a valid config) as the file alone would be refused, naming the file's key: a bad value there
    stopped nothing while a flag replaced it, then the server once the flag went (a tester's
    `port: 70000` under `--port`; a section that is no mapping, `model_defaults: []` under
    `--max-batch`, which the flag's section replaced whole). The file over the default first
    (its first error, as alone); then, past a conflict, each value put back alone into `merged`: a
    conflict is the combination's, not the file's (its port and grpc_port the same, `--grpc-port 0` given)."""
    replaced = origins.replaced()
    if not replaced:
        return
    layers = [merge(default_mapping(), data)]
    for key in replaced:
        keys, value = found(data, key)
        for part in reversed(keys):
            value = {part: value}
        layers.append(merge(merged, value))
    for layer in layers:
        try:
            parse_server_config(layer, given=given)
        except ConfigConflict:
            continue
        except ConfigError as e:
            key = next((k for k in replaced if e.path == k or e.path.startswith((f"{k}.", f"{k}["))), None)
            if key is not None:
                by = replaced[key]  # (several flags may set keys of one section)
                verb = "replaces" if len(by) == 1 else "replace"
                raise ConfigError(e.path, f"{e.problem} ({' and '.join(by)} {verb} it, but the file must hold on "
                                          "its own)", path) from None


def load_model_config(path: str | os.PathLike | None, defaults: ModelConfig,
                      notes: list[str] | None = None) -> ModelConfig:
    """A per-model YAML file merged over `defaults`; None -> `defaults`. Raises ConfigError.
    `notes` (when given) gets a line for each setting of `defaults` that does not apply to the model."""
    if path is None:
        return defaults
    return layer_model_config(read_yaml(path, regular_only=True), defaults, path, notes)


def layer_model_config(data: dict, defaults: ModelConfig, path: str | os.PathLike,
                       notes: list[str] | None = None) -> ModelConfig:
    """A model's own settings mapping (its YAML file's, or what triton_config.py makes of its
    config.pbtxt) merged over `defaults` and validated; errors and labels files are the file at
    `path`'s. `notes` as load_model_config's."""
    data = _levels_as_numbers(data)
    merged = merge(model_config_mapping(defaults), data)
    left_out = _one_level_when_ordered(merged, data) + _past_the_levels(merged, data)
    replaced = _defaults_beside_own_inputs(merged, data)
    origin_of = model_origins(data, str(path), defaults.origin_of)
    try:
        config = parse_model_config(merged)
    except ConfigConflict as e:  # each key's source: the model's file, or model_defaults' (a file or the default)
        raise e.with_origins(origin_of) from None
    except ConfigError as e:
        raise ConfigError(e.path, e.problem, str(path)) from None
    if left_out and notes is not None:
        levels = config.batching.priority_levels
        notes.append(f"{'; '.join(left_out)}: the model has {levels} priority level{'s' if levels > 1 else ''}")
    if replaced and notes is not None:
        notes.append("; ".join(replaced))
    own_batching = data.get("batching")
    if isinstance(own_batching, Mapping):  # (a static model fails only on its own max_batch_size: served.py)
        config = dataclasses.replace(config, batching=dataclasses.replace(config.batching,
                                                                          own_keys=frozenset(own_batching)))
    # a labels file the model's file names is relative to that file; one model_defaults names
    # stays as the server config gives it, relative to the working directory as its other paths
    folder, own = Path(path).parent, _giving(data, "outputs", "labels")
    outputs = {n: given_by_defaults(dataclasses.replace(o, labels=str(folder / o.labels)), {"labels"})
               if o.labels and n in own else given_by_defaults(o) for n, o in config.outputs.items()}
    # (those the file does not give are model_defaults': fitted to the model or passed over)
    own_inputs = {key: _giving(data, "inputs", key) for key in ("image", "value_range")}
    inputs = {n: given_by_defaults(o, {key for key, names in own_inputs.items() if n in names})
              for n, o in config.inputs.items()}
    # (a setting the model does not fit when it loads names its file: repository/settings_fit.py)
    return dataclasses.replace(config, inputs=inputs, outputs=outputs, origin_of=origin_of)


def _defaults_beside_own_inputs(merged: dict, data: Mapping) -> list[str]:
    """Take out of `merged` model_defaults' value_range of an input the model's file makes an image
    input, and its image settings of one the file gives a value_range: the two are refused
    together, and model_defaults fails no model (the model's load was refused for a pair its
    file did not give); what was left out, in words."""
    inputs = merged.get("inputs")
    if not isinstance(inputs, dict):
        return []
    said = []
    for given, other in (("image", "value_range"), ("value_range", "image")):
        for name in _giving(data, "inputs", given) - _giving(data, "inputs", other):
            entry = inputs.get(name)
            if isinstance(entry, dict) and entry.get(other) is not None:
                entry[other] = None
                said.append(f"model_defaults' inputs.{name}.{other} left out: the model's own inputs.{name}.{given} "
                            "replaces it")
    return said


def _own_levels(data: Mapping) -> Mapping:
    """The batching.priority_queue_policy mapping a model's file gives (empty if none or not a mapping)."""
    batching = data.get("batching")
    levels = batching.get("priority_queue_policy") if isinstance(batching, Mapping) else None
    return levels if isinstance(levels, Mapping) else {}


def _levels_as_numbers(data: dict) -> dict:
    """`data` with its priority_queue_policy keys written as digits ('2') made numbers, as
    model_defaults' are once parsed: a level given in both merges instead of being refused as
    given twice. A file giving one level both ways keeps its keys (the parser refuses it)."""
    levels = _own_levels(data)
    numbered = {int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k: v for k, v in levels.items()}
    if len(numbered) != len(levels) or numbered.keys() == levels.keys():
        return data
    return {**data, "batching": {**data["batching"], "priority_queue_policy": numbered}}


def _one_level_when_ordered(merged: dict, data: Mapping) -> list[str]:
    """A model's file turning preserve_ordering on without priority_levels of its own: one level in
    `merged` (answers in arrival order let no level pass another, and Triton refuses more: the
    default's three made every request wait for all earlier ones, whatever its priority); what was
    left out, in words. priority_levels over 1 in the file itself is refused beside it (model.py)."""
    batching, own = merged.get("batching"), data.get("batching")
    if not isinstance(batching, Mapping) or batching.get("preserve_ordering") is not True:
        return []
    levels = batching.get("priority_levels")
    if (isinstance(own, Mapping) and "priority_levels" in own) or type(levels) is not int or levels <= 1:
        return []
    batching["priority_levels"] = 1
    return [f"batching.preserve_ordering takes one priority level, not model_defaults' priority_levels {levels} "
            "(answers in arrival order let no level pass another)"]


def _past_the_levels(merged: dict, data: Mapping) -> list[str]:
    """Take out of `merged` what model_defaults alone gives for levels past the model's own
    priority_levels (its file setting fewer levels was refused for keys it did not hold): the
    per-level queue policies, and a default_priority past them, which goes back to auto (the
    middle level); what was left out, in words. What the file gives itself is checked as written."""
    batching = merged.get("batching")
    levels = batching.get("priority_levels") if isinstance(batching, Mapping) else None
    if isinstance(levels, bool) or not isinstance(levels, int):
        return []
    said = []
    policies = batching.get("priority_queue_policy")
    if isinstance(policies, dict):
        own = _own_levels(data)
        past = sorted(k for k in policies if isinstance(k, int) and k > levels and k not in own)
        for level in past:
            del policies[level]
        if past:
            said.append(f"model_defaults' batching.priority_queue_policy {'levels' if len(past) > 1 else 'level'} "
                        f"{', '.join(map(str, past))} left out")
    default = batching.get("default_priority")
    own_batching = data.get("batching")
    given = isinstance(own_batching, Mapping) and "default_priority" in own_batching
    if not given and type(default) is int and default > levels:
        batching["default_priority"] = AUTO
        said.append(f"model_defaults' batching.default_priority {default} is auto (its middle level) for it")
    return said


def _giving(data: Mapping, section: str, key: str) -> set[str]:
    """The tensors of `section` (inputs, outputs) whose `key` a model's file gives itself (not null)."""
    tensors = data.get(section)
    if not isinstance(tensors, Mapping):
        return set()
    return {str(n) for n, o in tensors.items() if isinstance(o, Mapping) and o.get(key) is not None}
