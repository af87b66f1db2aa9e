"""A model's settings (`model_defaults` and per-model files): mapping <-> ModelConfig."""
from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping

from ..om.compile_error import OptionRefused
from ..om.gears import MAX_BATCH_SIZE, MAX_BATCH_SIZE_WHY
from ..om.shape_args import check_precision_mode, parse_input_shape
from ..runtime.limits import MAX_INSTANCES, MAX_SLOTS
from ..runtime.warmup import WARMUP_DATA
from ..scheduling.policy import FORMATION_MODES, BatchingConfig, QueuePolicy
from .checks import (MAX_MS, as_bool, as_float, as_int, as_mapping, as_opt_str, as_str, int_list, is_auto, key_path,
                     no_unknown, numbers, shown, text_hint, unless_none)
from .image_values import check_normalisation
from .keys import (BATCHING_KEYS, COMPILE_KEYS, IMAGE_KEYS, INPUT_KEYS, MODEL_KEYS, OUTPUT_KEYS, PBTXT_FIELDS,
                   QUEUE_KEYS)
from .schema import (AUTO, COLOURS, INTERPOLATIONS, LAYOUTS, MAX_VERSION_DIGITS, RESIZE_POLICIES, CompileOptions,
                     ConfigConflict, ConfigError, ImageInput, ModelConfig, TensorOptions)

# each level has its queues, statistics and metric series (100,000 levels took 58 MB and a 6.5 MB
# /metrics; 100 million, the machine's memory): Triton's users name a handful
MAX_PRIORITY_LEVELS = 1000
MAX_QUEUE_SIZE = 2**32 - 1  # Triton's ModelQueuePolicy.max_queue_size is a uint32 (gRPC's /config could not say more)
MAX_LATEST = 2**32 - 1  # Triton's ModelVersionPolicy.Latest.num_versions is a uint32 (likewise)
MAX_VERSION = 10**MAX_VERSION_DIGITS - 1  # the largest version a folder can be named (schema.py)


def _queue_policy(data, path: str, base: QueuePolicy) -> QueuePolicy:
    data = as_mapping(data, path)
    no_unknown(data, QUEUE_KEYS, path)
    values = dataclasses.asdict(base)
    for key, value in data.items():
        kp = key_path(path, key)
        if key == "max_queue_size":
            values[key] = None if is_auto(value) else as_int(value, kp, 0, MAX_QUEUE_SIZE)
        elif key == "default_timeout_ms":
            values[key] = None if is_auto(value) else _deadline_ms(value, kp)
        elif key == "timeout_action":
            values[key] = as_str(value, kp, ("reject", "delay"))
        else:
            values[key] = as_bool(value, kp)
    return QueuePolicy(**values)


def _deadline_ms(value, path: str) -> float:
    """A queue deadline in ms: 0 (none), or at least a microsecond, the unit of Triton's
    default_timeout_microseconds, in which /config shows it. 0.0004 was shown as 0, no deadline,
    while every request that waited timed out (a tester's find)."""
    deadline = as_float(value, path, maximum=MAX_MS)
    if 0 < deadline < 0.001:
        raise ConfigError(path, f"is under a microsecond, which /config's default_timeout_microseconds (Triton's "
                                f"unit) would show as 0, no deadline, while every request that waits times out: "
                                f"give 0 for no deadline, or at least 0.001, got {shown(value)}")
    return deadline


def _batching(data, path: str) -> BatchingConfig:
    data = as_mapping(data, path)
    no_unknown(data, BATCHING_KEYS, path)
    kw: dict[str, Any] = {}
    for key in ("enabled", "preserve_ordering"):
        if key in data:
            kw[key] = as_bool(data[key], key_path(path, key))
    if "max_batch_size" in data:
        kw["batch_cap"] = as_int(data["max_batch_size"], key_path(path, "max_batch_size"), 0)
    if "max_queue_delay_ms" in data:
        kw["max_queue_delay_ms"] = as_float(data["max_queue_delay_ms"], key_path(path, "max_queue_delay_ms"),
                                            maximum=MAX_MS)
    if "batch_formation" in data:
        kw["batch_formation"] = as_str(data["batch_formation"], key_path(path, "batch_formation"), FORMATION_MODES)
    levels = as_int(data.get("priority_levels", 3), key_path(path, "priority_levels"), 1, MAX_PRIORITY_LEVELS)
    kw["priority_levels"] = levels
    kw["default_priority"] = _default_priority(data.get("default_priority", AUTO), levels, path)
    default_qp = _queue_policy(data.get("default_queue_policy", {}), key_path(path, "default_queue_policy"),
                               QueuePolicy())
    kw["default_queue_policy"] = default_qp
    per_level, fields = {}, {}
    pq_path = key_path(path, "priority_queue_policy")
    for level, policy in as_mapping(unless_none(data.get("priority_queue_policy"), {}), pq_path).items():
        lp = f"{pq_path}.{level}"
        if isinstance(level, str) and level.isascii() and level.isdigit():  # ('²'.isdigit(), not int())
            level = int(level)
        level = as_int(level, lp, 1)
        if level > levels:  # the bound may be the default's or model_defaults': each source named
            raise ConfigConflict(lp, f"names a level past priority_levels ({levels}): raise that too, or drop this "
                                     f"level, got {level}", (lp, key_path(path, "priority_levels")))
        if level in per_level:  # 1 and '1' (YAML's unique keys see two keys)
            raise ConfigError(lp, f"gives level {level} a second time")
        per_level[level] = _queue_policy(policy, lp, default_qp)
        fields[level] = frozenset(policy)
    kw["priority_queue_policy"], kw["priority_queue_fields"] = per_level, fields
    if kw.get("preserve_ordering"):
        _check_ordering(kw, path)
    try:
        return BatchingConfig(**kw)
    except ValueError as e:  # cross-field rules of BatchingConfig itself
        raise ConfigError(path, str(e)) from None


def _default_priority(value, levels: int, path: str) -> int | None:
    """auto (None): the middle level of however many the model has (BatchingConfig.default_level):
    a model's `priority_levels: 1` was refused for the embedded default's default_priority 2. One
    past the levels is refused naming both keys and where each came from: priority_levels may be
    the default's or model_defaults' (a bare "must be <= 3" blamed the file for a bound it did not set)."""
    if is_auto(value):
        return None
    where = key_path(path, "default_priority")
    default = as_int(value, where, 1)
    if default > levels:
        raise ConfigConflict(where, f"must be <= priority_levels ({levels}): raise that too, or lower this (auto: "
                                    f"the middle level), got {default}", (where, key_path(path, "priority_levels")))
    return default


def _check_ordering(kw: dict, path: str) -> None:
    """What Triton refuses beside preserve_ordering, as config.pbtxt's reader does (triton_config.py):
    answers held in arrival order let no level pass another, and a request moved back at its
    deadline (delay) would hold every later answer. (/config shows the pair otherwise.) Each
    refusal names the keys of the pair (a level's field it does not set is default_queue_policy's).
    A delay level without a deadline loads, as in Triton: a request's own timeout rejects there
    (scheduling/queue.py)."""
    levels, ordering = kw["priority_levels"], key_path(path, "preserve_ordering")
    if levels > 1:
        raise ConfigConflict(ordering, f"takes one priority level, not {levels} ({key_path(path, 'priority_levels')}): "
                             "answers in arrival order let no level pass another (Triton refuses the pair too); set "
                             "priority_levels: 1, or preserve_ordering: false",
                             (ordering, key_path(path, "priority_levels")))
    policies = [("default_queue_policy", kw["default_queue_policy"], None),
                *((f"priority_queue_policy.{k}", p, kw["priority_queue_fields"].get(k, frozenset()))
                  for k, p in sorted(kw["priority_queue_policy"].items()))]
    for where, policy, own in policies:
        if policy.timeout_action == "delay" and policy.default_timeout_ms != 0:  # (None: auto, over 0)
            given = [key_path(path, f"{where if own is None or field in own else 'default_queue_policy'}.{field}")
                     for field in ("timeout_action", "default_timeout_ms")]
            raise ConfigConflict(key_path(path, f"{where}.timeout_action"),
                                 "delay does not go with preserve_ordering: a request moved back at its deadline "
                                 "would hold every later answer (Triton refuses the pair too); set reject, or "
                                 "preserve_ordering: false", (ordering, *given))


def _version_policy(value, path: str) -> tuple:
    # named choices in any case, as every other (`ALL`, `{Latest: 2}`)
    if isinstance(value, str) and value.lower() == "all":
        return ("all",)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ConfigError(path, f"must be one of {{latest: N}}, all, {{specific: [versions]}}, got {shown(value)}")
    (given, arg), = value.items()
    kind = given.lower() if isinstance(given, str) else given
    # Triton's form too, as /v2/models/{m}/config shows it: {latest: {num_versions: 2}},
    # {specific: {versions: [1, 3]}} (pasted from there, it was refused)
    where = key_path(path, str(given))
    inner = {"latest": "num_versions", "specific": "versions"}.get(kind)
    if inner is not None and isinstance(arg, Mapping) and list(arg) == [inner]:
        where, arg = key_path(where, inner), arg[inner]
    if kind == "latest":  # (a larger number was taken, and /config answered 500: past what its fields carry)
        return ("latest", as_int(arg, where, 1, MAX_LATEST))
    if kind == "all":
        if arg not in (True, None, {}):
            raise ConfigError(where, f"takes no value, got {shown(arg)}")
        return ("all",)
    if kind == "specific":
        versions = int_list(arg, where, 1)
        for i, version in enumerate(versions):
            if version > MAX_VERSION:  # no folder is that version (and /config answered 500)
                raise ConfigError(f"{where}[{i}]", f"must be <= {MAX_VERSION} (a version is named by its folder, a "
                                                   f"positive integer of at most {MAX_VERSION_DIGITS} digits), got "
                                                   f"{version}")
        return ("specific", tuple(sorted(versions)))
    raise ConfigError(where, "unknown version policy (latest | all | specific)")


def _compile(data, path: str) -> CompileOptions:
    data = as_mapping(data, path)
    no_unknown(data, COMPILE_KEYS, path)
    batch = data.get("batch")
    input_shape = as_opt_str(data.get("input_shape"), key_path(path, "input_shape"))
    precision_mode = as_opt_str(data.get("precision_mode"), key_path(path, "precision_mode"))
    # refused now, as the other settings are, not at each model's compile (the input names need the model)
    checked = {}
    for key, check, value in (("input_shape", parse_input_shape, input_shape),
                              ("precision_mode", check_precision_mode, precision_mode)):
        try:
            checked[key] = check(value)
        except OptionRefused as e:
            raise ConfigError(key_path(path, key), e.problem) from None
    return CompileOptions(
        input_shape=input_shape,
        batch=None if batch is None else _batch_sizes(batch, key_path(path, "batch")),
        soc_version=as_opt_str(data.get("soc_version"), key_path(path, "soc_version")),
        precision_mode=checked["precision_mode"],  # (as ATC writes it: a named choice in any case)
    )


def _batch_sizes(value, path: str) -> tuple[int, ...]:
    """compile.batch, each size bounded now, not at each model's compile (`aclserve compile --batch`'s
    bound: shape_args.parse_gears)."""
    sizes = int_list(value, path, 1)
    for i, size in enumerate(sizes):
        if size > MAX_BATCH_SIZE:
            raise ConfigError(f"{path}[{i}]", f"must be <= {MAX_BATCH_SIZE}, {MAX_BATCH_SIZE_WHY}, got {size}")
    return sizes


def _image_input(data, path: str) -> ImageInput:
    data = as_mapping(data, path)
    no_unknown(data, IMAGE_KEYS, path)
    d = ImageInput()
    std = numbers(data.get("std"), key_path(path, "std"))
    if std is not None and 0.0 in std:
        raise ConfigError(key_path(path, "std"), "must not contain 0")
    crop = as_float(data.get("crop_fraction", d.crop_fraction), key_path(path, "crop_fraction"), 0.0)
    if not 0 < crop <= 1:
        raise ConfigError(key_path(path, "crop_fraction"), f"must be in (0, 1], got {crop:g}")
    color = data.get("color")
    color = None if color is None else as_str(color, key_path(path, "color"), COLOURS)
    mean = numbers(data.get("mean"), key_path(path, "mean"))
    check_normalisation(color, mean, std, path)  # (one no model could take: refused now, not at each load)
    return ImageInput(
        color=color,
        resize=as_str(data.get("resize", d.resize), key_path(path, "resize"), RESIZE_POLICIES),
        crop_fraction=crop,
        interpolation=as_str(data.get("interpolation", d.interpolation), key_path(path, "interpolation"),
                             INTERPOLATIONS),
        pad_value=as_int(data.get("pad_value", d.pad_value), key_path(path, "pad_value"), 0, 255),
        mean=mean,
        std=std,
        layout=as_str(data.get("layout", d.layout), key_path(path, "layout"), LAYOUTS),
        invert=_invert(data.get("invert", d.invert), key_path(path, "invert")),
    )


def _invert(value, path: str) -> bool | str:
    if isinstance(value, bool):
        return value
    if is_auto(value):
        return AUTO
    raise ConfigError(path, f"must be true, false or auto, got {shown(value)}")


def _tensor_options(data, path: str, role: str) -> dict[str, TensorOptions]:
    data = as_mapping(unless_none(data, {}), path)
    out = {}
    for name, options in data.items():
        if not isinstance(name, str):  # (`0x10:` named the tensor "16", `1.50:` "1.5": str() of YAML's number)
            raise ConfigError(path, f"the key {shown(name)} must be a tensor's name, a string{text_hint(name)}")
        tp = key_path(path, name)
        options = as_mapping(unless_none(options, {}), tp)
        if role == "outputs":
            no_unknown(options, OUTPUT_KEYS, tp)
            labels = options.get("labels")
            out[name] = TensorOptions(labels=None if labels is None else
                                      as_str(labels, key_path(tp, "labels"), allow_empty=False))
            continue
        no_unknown(options, INPUT_KEYS, tp)
        image, value_range = options.get("image"), options.get("value_range")
        if image is not None and value_range is not None:
            raise ConfigError(key_path(tp, "value_range"), "an image input takes pictures, not numbers: "
                                                           "set image or value_range, not both")
        out[name] = TensorOptions(image=None if image is None else _image_input(image, key_path(tp, "image")),
                                  value_range=None if value_range is None else
                                  _value_range(value_range, key_path(tp, "value_range")))
    return out


def _value_range(value, path: str) -> tuple[int, int]:
    """[smallest, largest], both integers, smallest first."""
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(path, f"must be [smallest, largest], two integers, got {shown(value)}")
    low, high = as_int(value[0], f"{path}[0]"), as_int(value[1], f"{path}[1]")
    if low > high:
        raise ConfigError(path, f"smallest {low} is above largest {high}")
    return low, high


def _slots(value, path: str) -> int:
    """`auto` (0 once parsed) or 1 to MAX_SLOTS (runtime/limits.py)."""
    return 0 if is_auto(value) else as_int(value, path, 1, MAX_SLOTS)


def parse_model_config(data, path: str = "") -> ModelConfig:
    """Validate a complete model mapping (already merged over the defaults)."""
    data = as_mapping(data, path)
    no_unknown(data, MODEL_KEYS, path)
    base = ModelConfig()
    return ModelConfig(
        instances=as_int(data.get("instances", base.instances), key_path(path, "instances"), 1, MAX_INSTANCES),
        devices=int_list(data.get("devices", list(base.devices)), key_path(path, "devices"), 0),
        slots=_slots(data.get("slots", AUTO), key_path(path, "slots")),
        retry=as_bool(data.get("retry", base.retry), key_path(path, "retry")),
        execution_timeout_ms=as_int(data.get("execution_timeout_ms", base.execution_timeout_ms),
                                  key_path(path, "execution_timeout_ms"), 0, MAX_MS),
        reset_timeout_ms=as_int(data.get("reset_timeout_ms", base.reset_timeout_ms),
                                key_path(path, "reset_timeout_ms"), 1, MAX_MS),
        warmup_data=as_str(data.get("warmup_data", base.warmup_data), key_path(path, "warmup_data"), WARMUP_DATA),
        batching=_batching(data.get("batching", {}), key_path(path, "batching")),
        version_policy=_version_policy(data.get("version_policy", {"latest": 1}), key_path(path, "version_policy")),
        compile=_compile(data.get("compile", {}), key_path(path, "compile")),
        inputs=_tensor_options(data.get("inputs"), key_path(path, "inputs"), "inputs"),
        outputs=_tensor_options(data.get("outputs"), key_path(path, "outputs"), "outputs"),
    )


def as_defaults(config: ModelConfig) -> ModelConfig:
    """`config` as model_defaults: its tensor settings marked as the defaults' (a model they do not
    fit takes them fitted or passes them over, not failing its load: TensorOptions.from_defaults)."""
    return dataclasses.replace(config, inputs={n: given_by_defaults(o) for n, o in config.inputs.items()},
                               outputs={n: given_by_defaults(o) for n, o in config.outputs.items()})


def given_by_defaults(options: TensorOptions, own: Collection[str] = ()) -> TensorOptions:
    """`options` with the settings it gives (image, value_range, labels) but those in `own` (the
    model's file gives them) marked as model_defaults' (TensorOptions.from_defaults)."""
    given = frozenset(key for key in ("image", "value_range", "labels")
                      if getattr(options, key) is not None and key not in own)
    return dataclasses.replace(options, from_defaults=given)


def model_config_mapping(config: ModelConfig) -> dict:
    """The YAML-shaped mapping of a ModelConfig (inverse of parse_model_config)."""
    out = dataclasses.asdict(dataclasses.replace(config, origin_of=None))
    out.pop("origin_of")  # (where the settings came from: not a key)
    for field in PBTXT_FIELDS:
        out.pop(field)
    out["devices"] = list(config.devices)
    out["slots"] = config.slots or AUTO
    kind = config.version_policy[0]
    out["version_policy"] = ({"all": True} if kind == "all" else
                             {kind: list(config.version_policy[1]) if kind == "specific"
                              else config.version_policy[1]})
    out["compile"]["batch"] = None if config.compile.batch is None else list(config.compile.batch)
    batching = out["batching"]
    batching["max_batch_size"] = batching.pop("batch_cap")
    if batching["default_priority"] is None:
        batching["default_priority"] = AUTO
    # a level keeps only the fields it set: a later layer's default_queue_policy (a model's file
    # over model_defaults) gives it the others, as a level in the same file takes them
    fields = batching.pop("priority_queue_fields")
    batching.pop("own_keys")  # (a model's own file's: not model_defaults', which a model's file layers over)
    batching.pop("priorities_off")  # (a config.pbtxt's, set once its settings are layered: triton_config.py)
    levels = batching["priority_queue_policy"]
    for level, policy in levels.items():
        levels[level] = {k: v for k, v in policy.items() if k in fields.get(level, policy)}
    for policy in [batching["default_queue_policy"], *levels.values()]:
        policy.pop("counts_rows", None)
        for key in ("max_queue_size", "default_timeout_ms"):
            if key in policy and policy[key] is None:
                policy[key] = AUTO
    out["inputs"] = {n: {"image": None if o.image is None else dataclasses.asdict(o.image),
                         "value_range": None if o.value_range is None else list(o.value_range)}
                     for n, o in config.inputs.items()}
    out["outputs"] = {n: {"labels": o.labels} for n, o in config.outputs.items()}
    return out
