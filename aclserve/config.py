"""Server and model configuration: YAML -> frozen dataclasses, every bad key reported by path.

The one source of defaults is the embedded `aclserve/configs/default.yaml` (documented key by
key; `configs/default.yaml` at the repository root is a byte-identical copy for readers). A
user file is deep-merged over it, then command-line overrides over that; the merged mapping
is validated in one pass. Unknown keys and bad values raise ConfigError whose message starts
with the dotted path of the key, e.g.
`model_defaults.batching.max_queue_delay_ms: must be >= 0, got -1`.

Merging: mappings merge key by key, except `version_policy`, which a later layer replaces
whole (it is a one-key choice). A per-model file (`models/<name>.yaml` or
`models/<name>/config.yaml`) has the keys of `model_defaults` and merges over the server's
`model_defaults` the same way. Entries of `batching.priority_queue_policy` (keyed by level
number) inherit unset fields from `batching.default_queue_policy`.
Relative paths (models_dir, compile_cache_dir) are relative to the working directory.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .logs import FORMATS as LOG_FORMATS
from .scheduling.policy import FORMATION_MODES, BatchingConfig, QueuePolicy
from .trace.settings import TraceSettings, TraceSettingsError

DEFAULT_CONFIG_PATH = Path(__file__).with_name("configs") / "default.yaml"
CONTROL_MODES = ("poll", "explicit", "none")
READINESS = ("strict", "lenient")
AUTO = "auto"  # queue size / deadline derived from the model when it loads (repository/overload.py)
DEVICES = ("auto", "cpu", "npu")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_REPLACED_WHOLE = {"version_policy"}


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; `path` is the dotted key."""

    def __init__(self, path: str, problem: str, source: str | None = None):
        self.path, self.problem, self.source = path, problem, source
        text = f"{path}: {problem}" if path else problem
        super().__init__(f"{source}: {text}" if source else text)


@dataclass(frozen=True)
class CompileOptions:
    """How a dropped `.onnx` is compiled (see `aclserve compile`); None = compiler default."""

    input_shape: str | None = None  # "name:-1,3,224,224;name2:..."
    batch: tuple[int, ...] | None = None  # gears; None = the compiler's default
    soc_version: str | None = None  # ATC only
    precision_mode: str | None = None  # ATC only


COLOURS = ("rgb", "bgr", "gray")
RESIZE_POLICIES = ("stretch", "center_crop", "letterbox")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "area")
LAYOUTS = ("auto", "NCHW", "NHWC")
DECODERS = ("cpu", "dvpp")


@dataclass(frozen=True)
class ImageInput:
    """An input that takes encoded images (JPEG/PNG as BYTES) and how they become its tensor."""

    color: str | None = None  # rgb | bgr | gray; None = gray for 1 channel, else rgb
    resize: str = "stretch"  # stretch | center_crop | letterbox
    crop_fraction: float = 1.0  # center_crop: the crop is this fraction of the resized shorter side
    interpolation: str = "bilinear"
    pad_value: int = 0  # letterbox fill, pixel units
    mean: tuple[float, ...] | None = None  # host normalisation (float inputs only), pixel units
    std: tuple[float, ...] | None = None
    layout: str = "auto"  # float inputs: NCHW | NHWC; auto = from the model's format and dims
    invert: bool | str = False  # True: 255 - pixel; "auto": invert when the image's border is light


@dataclass(frozen=True)
class TensorOptions:
    """Per-tensor settings of a model: `image` for inputs, `labels` for outputs."""

    image: ImageInput | None = None
    labels: str | None = None  # labels file, one per line; relative to the config file's folder


@dataclass(frozen=True)
class ImageSettings:
    """Server-wide image decoding: the worker pool and the decompression limits."""

    workers: int = 2  # decode threads; 0 = decode on the event loop (for comparisons only)
    max_pending: int = 256  # images queued or decoding at once; more -> 503
    max_pixels: int = 40_000_000  # width x height an image header may announce
    max_side: int = 16384
    decoder: str = "cpu"  # cpu | dvpp (NPU hosts: JPEG decode and resize on the chip)


@dataclass(frozen=True)
class ModelConfig:
    """Serving settings of one model (all its versions)."""

    instances: int = 1
    devices: tuple[int, ...] = (0,)
    slots: int = 0  # 0 = auto: served.auto_slots when the model loads (repository/served.py)
    retry: bool = True
    execution_timeout_ms: int = 0  # 0 = from the measured gear costs (pool.set_execution_timeout)
    batching: BatchingConfig = field(default_factory=lambda: BatchingConfig(
        default_queue_policy=QueuePolicy(max_queue_size=None, default_timeout_ms=None)))
    version_policy: tuple = ("latest", 1)  # ("latest", N) | ("all",) | ("specific", (v, ...))
    compile: CompileOptions = field(default_factory=CompileOptions)
    inputs: dict[str, TensorOptions] = field(default_factory=dict)  # by input name
    outputs: dict[str, TensorOptions] = field(default_factory=dict)  # by output name


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 8001  # 0 = no gRPC endpoint
    models_dir: str = "models"
    device: str = "auto"
    log_level: str = "info"
    log_format: str = "text"  # text | json (one object per line)
    request_log: bool = False  # one log line per infer request
    trace: TraceSettings = field(default_factory=TraceSettings)  # the global trace settings at start
    trace_dir: str = "traces"  # where trace_file names set through the API are written
    model_control_mode: str = "poll"
    max_body_bytes: int = 64 * 1024 * 1024
    max_json_bytes: int = 16 * 1024 * 1024
    max_json_elements: int = 1024 * 1024
    max_request_bytes: int = 256 * 1024 * 1024
    max_inflight_bytes: int = 512 * 1024 * 1024
    max_connections: int = 4096
    listen_backlog: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 15.0
    hold_refused_connections: bool = False
    shed_before_parsing: bool = True
    api_token: str = field(default="", repr=False)  # never printed; ACLSERVE_API_TOKEN wins
    auth_inference: bool = False
    readiness: str = "strict"
    load_retry_initial_s: float = 1.0
    load_retry_max_s: float = 60.0
    shutdown_timeout_s: float = 30.0
    load_concurrency: int = 1
    cpu_threads: int = 1
    compile_cache_dir: str = ""  # "" = <models_dir>/.cache, else a user cache folder (repository/cache_dir.py)
    unload_on_delete: bool = True
    settle_s: float = 1.0
    debounce_s: float = 0.25
    memory_reserve_fraction: float = 0.1
    # (streams, events) per device; None for either = what the runtime knows for this device
    device_limits: tuple[int | None, int | None] = (None, None)
    images: ImageSettings = field(default_factory=ImageSettings)
    model_defaults: ModelConfig = field(default_factory=ModelConfig)


# ---- merging -------------------------------------------------------------------------------

def merge(base: Mapping, over: Mapping) -> dict:
    """Deep-merge `over` onto `base` (new dict; inputs untouched)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
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


def read_yaml(path: str | os.PathLike) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"invalid YAML: {e}", str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"must be a mapping at the top level, got {type(data).__name__}", str(path))
    return data


def default_mapping() -> dict:
    return read_yaml(DEFAULT_CONFIG_PATH)


# ---- value checks --------------------------------------------------------------------------

def _p(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _mapping(value, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, got {value!r}")
    return value


def _no_unknown(data: Mapping, known, path: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(_p(path, str(key)), f"unknown key (known: {', '.join(sorted(known))})")


def _int(value, path: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(path, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(path, f"must be <= {maximum}, got {value}")
    return value


def _float(value, path: str, minimum: float | None = 0.0, below: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(path, f"must be a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(path, f"must be >= {minimum:g}, got {value:g}")
    if below is not None and value >= below:
        raise ConfigError(path, f"must be < {below:g}, got {value:g}")
    return float(value)


def _bool(value, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be true or false, got {value!r}")
    return value


def _str(value, path: str, choices=None, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ConfigError(path, f"must be a {'non-empty ' if not allow_empty else ''}string, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(path, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _opt_str(value, path: str) -> str | None:
    return None if value is None else _str(value, path, allow_empty=False)


def _int_list(value, path: str, minimum: int = 0, non_empty: bool = True) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or (non_empty and not value):
        raise ConfigError(path, f"must be a {'non-empty ' if non_empty else ''}list of integers, got {value!r}")
    items = tuple(_int(v, f"{path}[{i}]", minimum) for i, v in enumerate(value))
    if len(set(items)) != len(items):
        raise ConfigError(path, f"has duplicates: {list(items)}")
    return items


# ---- sections ------------------------------------------------------------------------------

_QUEUE_KEYS = {f.name for f in dataclasses.fields(QueuePolicy)}
# YAML keys of `batching`: the dataclass fields, with the cap under Triton's name
_BATCHING_KEYS = {f.name for f in dataclasses.fields(BatchingConfig)} - {"batch_cap"} | {"max_batch_size"}
_MODEL_KEYS = {f.name for f in dataclasses.fields(ModelConfig)}
_SERVER_KEYS = {f.name for f in dataclasses.fields(ServerConfig)}
_COMPILE_KEYS = {f.name for f in dataclasses.fields(CompileOptions)}


def _queue_policy(data, path: str, base: QueuePolicy) -> QueuePolicy:
    data = _mapping(data, path)
    _no_unknown(data, _QUEUE_KEYS, path)
    values = dataclasses.asdict(base)
    for key, value in data.items():
        kp = _p(path, key)
        if key == "max_queue_size":
            values[key] = None if value == AUTO else _int(value, kp, 0)
        elif key == "default_timeout_ms":
            values[key] = None if value == AUTO else _float(value, kp)
        elif key == "timeout_action":
            values[key] = _str(value, kp, ("reject", "delay"))
        else:
            values[key] = _bool(value, kp)
    return QueuePolicy(**values)


def _batching(data, path: str) -> BatchingConfig:
    data = _mapping(data, path)
    _no_unknown(data, _BATCHING_KEYS, path)
    kw: dict[str, Any] = {}
    for key in ("enabled", "preserve_ordering"):
        if key in data:
            kw[key] = _bool(data[key], _p(path, key))
    if "max_batch_size" in data:
        kw["batch_cap"] = _int(data["max_batch_size"], _p(path, "max_batch_size"), 0)
    if "max_queue_delay_ms" in data:
        kw["max_queue_delay_ms"] = _float(data["max_queue_delay_ms"], _p(path, "max_queue_delay_ms"))
    if "batch_formation" in data:
        kw["batch_formation"] = _str(data["batch_formation"], _p(path, "batch_formation"), FORMATION_MODES)
    levels = _int(data.get("priority_levels", 3), _p(path, "priority_levels"), 1)
    kw["priority_levels"] = levels
    if "default_priority" in data:
        kw["default_priority"] = _int(data["default_priority"], _p(path, "default_priority"), 1, levels)
    default_qp = _queue_policy(data.get("default_queue_policy", {}), _p(path, "default_queue_policy"),
                               QueuePolicy())
    kw["default_queue_policy"] = default_qp
    per_level = {}
    pq_path = _p(path, "priority_queue_policy")
    for level, policy in _mapping(data.get("priority_queue_policy") or {}, pq_path).items():
        lp = f"{pq_path}.{level}"
        if isinstance(level, str) and level.isdigit():
            level = int(level)
        per_level[_int(level, lp, 1, levels)] = _queue_policy(policy, lp, default_qp)
    kw["priority_queue_policy"] = per_level
    try:
        return BatchingConfig(**kw)
    except ValueError as e:  # cross-field rules of BatchingConfig itself
        raise ConfigError(path, str(e)) from None


def _version_policy(value, path: str) -> tuple:
    if value == "all":
        return ("all",)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ConfigError(path, f"must be one of {{latest: N}}, all, {{specific: [versions]}}, got {value!r}")
    (kind, arg), = value.items()
    if kind == "latest":
        return ("latest", _int(arg, _p(path, "latest"), 1))
    if kind == "all":
        if arg not in (True, None, {}):
            raise ConfigError(_p(path, "all"), f"takes no value, got {arg!r}")
        return ("all",)
    if kind == "specific":
        return ("specific", tuple(sorted(_int_list(arg, _p(path, "specific"), 1))))
    raise ConfigError(_p(path, str(kind)), "unknown version policy (latest | all | specific)")


def _compile(data, path: str) -> CompileOptions:
    data = _mapping(data, path)
    _no_unknown(data, _COMPILE_KEYS, path)
    batch = data.get("batch")
    return CompileOptions(
        input_shape=_opt_str(data.get("input_shape"), _p(path, "input_shape")),
        batch=None if batch is None else _int_list(batch, _p(path, "batch"), 1),
        soc_version=_opt_str(data.get("soc_version"), _p(path, "soc_version")),
        precision_mode=_opt_str(data.get("precision_mode"), _p(path, "precision_mode")),
    )


_IMAGE_KEYS = {f.name for f in dataclasses.fields(ImageInput)}
_IMAGE_SETTINGS_KEYS = {f.name for f in dataclasses.fields(ImageSettings)}


def _numbers(value, path: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 4:
        raise ConfigError(path, f"must be a number or a list of 1 to 4 numbers, got {value!r}")
    return tuple(_float(v, f"{path}[{i}]", None) for i, v in enumerate(value))


def _image_input(data, path: str) -> ImageInput:
    data = _mapping(data, path)
    _no_unknown(data, _IMAGE_KEYS, path)
    d = ImageInput()
    std = _numbers(data.get("std"), _p(path, "std"))
    if std is not None and 0.0 in std:
        raise ConfigError(_p(path, "std"), "must not contain 0")
    crop = _float(data.get("crop_fraction", d.crop_fraction), _p(path, "crop_fraction"), 0.0)
    if not 0 < crop <= 1:
        raise ConfigError(_p(path, "crop_fraction"), f"must be in (0, 1], got {crop:g}")
    color = data.get("color")
    return ImageInput(
        color=None if color is None else _str(color, _p(path, "color"), COLOURS),
        resize=_str(data.get("resize", d.resize), _p(path, "resize"), RESIZE_POLICIES),
        crop_fraction=crop,
        interpolation=_str(data.get("interpolation", d.interpolation), _p(path, "interpolation"), INTERPOLATIONS),
        pad_value=_int(data.get("pad_value", d.pad_value), _p(path, "pad_value"), 0, 255),
        mean=_numbers(data.get("mean"), _p(path, "mean")),
        std=std,
        layout=_str(data.get("layout", d.layout), _p(path, "layout"), LAYOUTS),
        invert=_invert(data.get("invert", d.invert), _p(path, "invert")),
    )


def _invert(value, path: str) -> bool | str:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ConfigError(path, f"must be true, false or auto, got {value!r}")


def _tensor_options(data, path: str, role: str) -> dict[str, TensorOptions]:
    data = _mapping(data or {}, path)
    out = {}
    key = "image" if role == "inputs" else "labels"
    for name, options in data.items():
        tp = _p(path, str(name))
        options = _mapping(options or {}, tp)
        _no_unknown(options, {key}, tp)
        value = options.get(key)
        if value is None:
            out[str(name)] = TensorOptions()
        elif role == "inputs":
            out[str(name)] = TensorOptions(image=_image_input(value, _p(tp, key)))
        else:
            out[str(name)] = TensorOptions(labels=_str(value, _p(tp, key), allow_empty=False))
    return out


def _image_settings(data) -> ImageSettings:
    data = _mapping(data or {}, "images")
    _no_unknown(data, _IMAGE_SETTINGS_KEYS, "images")
    d = ImageSettings()
    return ImageSettings(
        workers=_int(data.get("workers", d.workers), "images.workers", 0, 256),
        max_pending=_int(data.get("max_pending", d.max_pending), "images.max_pending", 1),
        max_pixels=_int(data.get("max_pixels", d.max_pixels), "images.max_pixels", 1),
        max_side=_int(data.get("max_side", d.max_side), "images.max_side", 1, 65535),
        decoder=_str(data.get("decoder", d.decoder), "images.decoder", DECODERS),
    )


def _slots(value, path: str) -> int:
    """`auto` (0 once parsed) or at least 1."""
    return 0 if value == AUTO else _int(value, path, 1)


def parse_model_config(data, path: str = "") -> ModelConfig:
    """Validate a complete model mapping (already merged over the defaults)."""
    data = _mapping(data, path)
    _no_unknown(data, _MODEL_KEYS, path)
    base = ModelConfig()
    return ModelConfig(
        instances=_int(data.get("instances", base.instances), _p(path, "instances"), 1),
        devices=_int_list(data.get("devices", list(base.devices)), _p(path, "devices"), 0),
        slots=_slots(data.get("slots", AUTO), _p(path, "slots")),
        retry=_bool(data.get("retry", base.retry), _p(path, "retry")),
        execution_timeout_ms=_int(data.get("execution_timeout_ms", base.execution_timeout_ms),
                                  _p(path, "execution_timeout_ms"), 0),
        batching=_batching(data.get("batching", {}), _p(path, "batching")),
        version_policy=_version_policy(data.get("version_policy", {"latest": 1}), _p(path, "version_policy")),
        compile=_compile(data.get("compile", {}), _p(path, "compile")),
        inputs=_tensor_options(data.get("inputs"), _p(path, "inputs"), "inputs"),
        outputs=_tensor_options(data.get("outputs"), _p(path, "outputs"), "outputs"),
    )


def model_config_mapping(config: ModelConfig) -> dict:
    """The YAML-shaped mapping of a ModelConfig (inverse of parse_model_config)."""
    out = dataclasses.asdict(config)
    out["devices"] = list(config.devices)
    out["slots"] = config.slots or AUTO
    kind = config.version_policy[0]
    out["version_policy"] = ({"all": True} if kind == "all" else
                             {kind: list(config.version_policy[1]) if kind == "specific"
                              else config.version_policy[1]})
    out["compile"]["batch"] = None if config.compile.batch is None else list(config.compile.batch)
    batching = out["batching"]
    batching["max_batch_size"] = batching.pop("batch_cap")
    for policy in [batching["default_queue_policy"], *batching["priority_queue_policy"].values()]:
        for key in ("max_queue_size", "default_timeout_ms"):
            if policy[key] is None:
                policy[key] = AUTO
    out["inputs"] = {n: {"image": None if o.image is None else dataclasses.asdict(o.image)}
                     for n, o in config.inputs.items()}
    out["outputs"] = {n: {"labels": o.labels} for n, o in config.outputs.items()}
    return out


def parse_server_config(data: Mapping) -> ServerConfig:
    """Validate a complete server mapping (already merged over the embedded default)."""
    data = _mapping(data, "")
    _no_unknown(data, _SERVER_KEYS, "")
    d = ServerConfig()
    get = lambda key: data.get(key, getattr(d, key))  # noqa: E731
    models_dir = _str(get("models_dir"), "models_dir", allow_empty=False)
    cache_dir = _str(data.get("compile_cache_dir") or "", "compile_cache_dir")
    token = data.get("api_token") or ""
    if not isinstance(token, str):
        raise ConfigError("api_token", "must be a string")  # the value is a secret: not echoed
    max_inflight = _int(get("max_inflight_bytes"), "max_inflight_bytes", 1)
    initial_retry = _float(get("load_retry_initial_s"), "load_retry_initial_s")
    return ServerConfig(
        host=_str(get("host"), "host", allow_empty=False),
        port=_int(get("port"), "port", 0, 65535),
        grpc_port=_int(get("grpc_port"), "grpc_port", 0, 65535),
        models_dir=models_dir,
        device=_str(get("device"), "device", DEVICES),
        log_level=_str(get("log_level"), "log_level", LOG_LEVELS),
        log_format=_str(get("log_format"), "log_format", LOG_FORMATS),
        request_log=_bool(get("request_log"), "request_log"),
        trace=_trace(data.get("trace") or {}),
        trace_dir=_str(get("trace_dir"), "trace_dir", allow_empty=False),
        model_control_mode=_str(get("model_control_mode"), "model_control_mode", CONTROL_MODES),
        max_body_bytes=_int(get("max_body_bytes"), "max_body_bytes", 1),
        max_json_bytes=_int(get("max_json_bytes"), "max_json_bytes", 1),
        max_json_elements=_int(get("max_json_elements"), "max_json_elements", 1),
        max_request_bytes=_int(get("max_request_bytes"), "max_request_bytes", 1, max_inflight),
        max_inflight_bytes=max_inflight,
        max_connections=_int(get("max_connections"), "max_connections", 1),
        listen_backlog=_int(get("listen_backlog"), "listen_backlog", 1),
        header_timeout_s=_float(get("header_timeout_s"), "header_timeout_s", 0.001),
        body_timeout_s=_float(get("body_timeout_s"), "body_timeout_s", 0.001),
        keepalive_timeout_s=_float(get("keepalive_timeout_s"), "keepalive_timeout_s", 0.001),
        hold_refused_connections=_bool(get("hold_refused_connections"), "hold_refused_connections"),
        shed_before_parsing=_bool(get("shed_before_parsing"), "shed_before_parsing"),
        api_token=token,
        auth_inference=_bool(get("auth_inference"), "auth_inference"),
        readiness=_str(get("readiness"), "readiness", READINESS),
        load_retry_initial_s=initial_retry,
        load_retry_max_s=_float(get("load_retry_max_s"), "load_retry_max_s", initial_retry),
        shutdown_timeout_s=_float(get("shutdown_timeout_s"), "shutdown_timeout_s"),
        load_concurrency=_int(get("load_concurrency"), "load_concurrency", 1),
        cpu_threads=_int(get("cpu_threads"), "cpu_threads", 1),
        compile_cache_dir=cache_dir,
        unload_on_delete=_bool(get("unload_on_delete"), "unload_on_delete"),
        settle_s=_float(get("settle_s"), "settle_s"),
        debounce_s=_float(get("debounce_s"), "debounce_s"),
        memory_reserve_fraction=_float(get("memory_reserve_fraction"), "memory_reserve_fraction", 0.0, 1.0),
        device_limits=_device_limits(data.get("device_limits") or {}),
        images=_image_settings(data.get("images")),
        model_defaults=parse_model_config(data.get("model_defaults", {}), "model_defaults"),
    )


_TRACE_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count",
               "log_frequency": "log_frequency", "file": "trace_file", "format": "trace_format"}


def _trace(value) -> TraceSettings:
    data = _mapping(value, "trace")
    _no_unknown(data, _TRACE_KEYS, "trace")
    settings = TraceSettings()
    for key, item in data.items():
        if isinstance(item, bool) or item is None:
            hint = " (write \"OFF\" in quotes: YAML reads a bare OFF as false)" if item is False else ""
            raise ConfigError(f"trace.{key}", f"must be a string or a number, got {item!r}{hint}")
        try:
            settings = settings.updated({_TRACE_KEYS[key]: item})
        except TraceSettingsError as e:
            raise ConfigError(f"trace.{key}", str(e).split(": ", 1)[-1]) from None
    return settings


def _device_limits(value) -> tuple[int | None, int | None]:
    data = _mapping(value, "device_limits")
    _no_unknown(data, {"streams", "events"}, "device_limits")
    streams, events = data.get("streams"), data.get("events")
    return (None if streams is None else _int(streams, "device_limits.streams", 1),
            None if events is None else _int(events, "device_limits.events", 1))


def load_server_config(path: str | os.PathLike | None = None, overrides: Mapping | None = None) -> ServerConfig:
    """Embedded default <- YAML file at `path` <- `overrides` (nested or dotted keys; None values
    are ignored so argparse defaults of None fall through). Raises ConfigError."""
    merged = default_mapping()
    source = None
    if path is not None:
        source = str(path)
        merged = merge(merged, read_yaml(path))
    if overrides:
        merged = merge(merged, _expand_dotted(overrides))
    try:
        return parse_server_config(merged)
    except ConfigError as e:
        if source and e.source is None:
            raise ConfigError(e.path, e.problem, source) from None
        raise


def load_model_config(path: str | os.PathLike | None, defaults: ModelConfig) -> ModelConfig:
    """A per-model YAML file merged over `defaults`; None -> `defaults`. Raises ConfigError."""
    if path is None:
        return defaults
    data = read_yaml(path)
    try:
        config = parse_model_config(merge(model_config_mapping(defaults), data))
    except ConfigError as e:
        raise ConfigError(e.path, e.problem, str(path)) from None
    folder = Path(path).parent  # labels files are named relative to the config file
    outputs = {n: dataclasses.replace(o, labels=str(folder / o.labels)) if o.labels else o
               for n, o in config.outputs.items()}
    return dataclasses.replace(config, outputs=outputs)
