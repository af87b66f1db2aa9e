"""The configuration's shape: frozen dataclasses with their defaults, the choices a key may take,
and ConfigError (every bad key is reported by its dotted path)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..om.compile_error import DEFAULT_TIMEOUT_S
from ..scheduling.policy import BatchingConfig, QueuePolicy
from ..trace.settings import TraceSettings

CONTROL_MODES = ("poll", "explicit", "none")
READINESS = ("strict", "lenient")
THREAD_SCHEDULING = ("batch", "inherited")  # thread_policy.py
AUTO = "auto"  # queue size / deadline derived from the model when it loads (repository/overload.py)
DEVICES = ("auto", "cpu", "npu")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# gRPC messages the server receives at once at the least (two ModelStreamInfer streams and two
# unary calls: server/grpc_arrivals.py); grpc_max_message_bytes is at most max_inflight_bytes / this
GRPC_MIN_ARRIVING = 4
# a model version is a folder named by a positive integer of at most this many digits: the version
# folders the scan takes, the versions requests name and those a version_policy lists (beyond it, /config's
# JSON and Triton's int64 versions could not carry one)
MAX_VERSION_DIGITS = 18


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; `path` is the dotted key."""

    def __init__(self, path: str, problem: str, source: str | None = None):
        self.path, self.problem, self.source = path, problem, source
        super().__init__(self._text())

    def _text(self) -> str:
        text = f"{self.path}: {self.problem}" if self.path else self.problem
        return f"{self.source}: {text}" if self.source else text


class ConfigFileUnread(ConfigError):
    """A config file that could not be read (an OSError: its permissions, too many open files): it
    says nothing of what the file holds, so what keeps a file's reading (repository/config_reads.py)
    keeps none of it, and reads it again next time."""


class ConfigConflict(ConfigError):
    """Settings whose values do not go together (port and grpc_port the same): `keys` the dotted
    keys (the problem says their values), `origins` where each came from once known: a flag
    (`--port`), the config file's path, an environment variable, `the default`. The message
    names the origin of each: a conflict is no one source's (a file's grpc_port equal to
    `--port` was blamed on the file alone). Its raiser gives the origins only it knows (an
    environment variable); the loader adds the others (origins.Origins.blamed)."""

    def __init__(self, path: str, problem: str, keys: Sequence[str], origins: Mapping[str, str] | None = None):
        self.keys, self.origins = tuple(keys), dict(origins or {})
        super().__init__(path, problem)

    def _text(self) -> str:
        said = [f"{key} from {self.origins[key]}" for key in self.keys if key in self.origins]
        return f"{super()._text()} ({', '.join(said)})" if said else super()._text()

    def with_origins(self, origin_of: Callable[[str], str]) -> ConfigConflict:
        """This conflict with every key's origin: its raiser's where given, else `origin_of(key)`."""
        return ConfigConflict(self.path, self.problem, self.keys,
                              {key: self.origins.get(key) or origin_of(key) for key in self.keys})


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
    """Per-tensor settings of a model: `image` and `value_range` for inputs, `labels` for outputs."""

    image: ImageInput | None = None
    labels: str | None = None  # labels file, one per line; a model file's: relative to its folder
    # labels named by a config.pbtxt's label_filename: read as Triton reads them, any number of lines
    # (repository/labels.py); a YAML's `labels` must have one per class
    labels_as_triton: bool = False
    # an integer input's smallest and largest value (both taken); others are refused (400)
    value_range: tuple[int, int] | None = None
    # which of image, value_range and labels model_defaults gives, not the model's own: meant for every
    # model, each is fitted to the model or passed over where it cannot apply, never failing its load
    # (repository/value_ranges.py and labels.py, images/stage.py); the model's own fails it
    from_defaults: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DeclaredTensor:
    """An input or output a config.pbtxt lists, compared with the model's when it loads
    (repository/declared.py): its name, `data_type` (the KServe name, "FP32") and `dims`, the
    shape clients send or are answered in (both must be given: triton_tensors.py); `reshape`, when
    given, the shape the model takes or gives instead. `with_batch`: max_batch_size 0 and both
    lists given, so dims and reshape hold the batch dimension too (Triton's meaning). `optional`:
    an input Triton does not count among those the model must have."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    with_batch: bool = False
    optional: bool = False


@dataclass(frozen=True)
class DeclaredTensors:
    """A config.pbtxt's `input` and `output` lists (config/triton_tensors.py). `unbatched`: its
    max_batch_size is 0, so a model without a batch dimension is compared whole (one list given or
    both: Triton's ONNX Runtime backend completes no max_batch_size for such a model)."""

    inputs: tuple[DeclaredTensor, ...] = ()
    outputs: tuple[DeclaredTensor, ...] = ()
    unbatched: bool = False


@dataclass(frozen=True)
class ImageSettings:
    """Server-wide image decoding: the worker pool and the decompression limits."""

    workers: int = 2  # decode threads; 0 = decode on the event loop (for comparisons only)
    max_pending: int = 256  # images queued or decoding at once; more -> 503
    max_pixels: int = 40_000_000  # width x height an image header may announce
    max_side: int = 16384
    max_scan_pixels: int = 800_000_000  # width x height x scans of a JPEG (header.check_work)
    decoder: str = "cpu"  # cpu | dvpp (JPEG decode and resize on DVPP: the chip, or the CPU runtime's emulation)
    dvpp_device: int = 0  # the device whose DVPP decodes (decoder dvpp)


@dataclass(frozen=True)
class ModelConfig:
    """Serving settings of one model (all its versions)."""

    instances: int = 1
    devices: tuple[int, ...] = (0,)
    slots: int = 0  # 0 = auto: served.auto_slots when the model loads (repository/served.py)
    retry: bool = True
    execution_timeout_ms: int = 0  # 0 = from the measured gear costs (pool.set_execution_timeout)
    reset_timeout_ms: int = 10_000  # how long a reset or a close waits for the device (runtime/teardown.py)
    warmup_data: str = "zeros"  # WARMUP_DATA (runtime/warmup.py): ones for a model dividing by an input
    batching: BatchingConfig = field(default_factory=lambda: BatchingConfig(
        default_queue_policy=QueuePolicy(max_queue_size=None, default_timeout_ms=None)))
    version_policy: tuple = ("latest", 1)  # ("latest", N) | ("all",) | ("specific", (v, ...))
    compile: CompileOptions = field(default_factory=CompileOptions)
    inputs: dict[str, TensorOptions] = field(default_factory=dict)  # by input name
    outputs: dict[str, TensorOptions] = field(default_factory=dict)  # by output name
    # a config.pbtxt's tensors, not a key: checked against the model at load, and the shapes clients see
    declared: DeclaredTensors | None = None
    # a config.pbtxt's, not keys (triton_config.py): compile.batch came from its max_batch_size (a load
    # refused for memory names it), and the preferred_batch_size values in it (an .om's scan says them passed over)
    batch_from_pbtxt: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    # a config.pbtxt's instance_group gpus, group by group, not a key: a device the host has not is
    # named in that field (repository/served.devices_refusal), not as the devices they became
    pbtxt_gpus: tuple[tuple[int, ...], ...] = ()
    # not a key: where each setting came from, for a model's conflict (files.layer_model_config) and a setting
    # that does not fit the model when it loads (repository/settings_fit.py) to name: model_defaults'
    # origins.Origins.of_model_default, a model's origins.model_origins; None for one built in code
    origin_of: Callable[[str], str] | None = field(default=None, compare=False, repr=False)


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
    max_inflate_ratio: int = 100  # 0: none
    max_json_bytes: int = 16 * 1024 * 1024
    max_json_elements: int = 1024 * 1024
    max_request_bytes: int = 256 * 1024 * 1024
    max_inflight_bytes: int = 512 * 1024 * 1024
    max_inflight_bytes_per_model: int = 0  # 0 = auto: server/budget.model_share
    max_connections: int = 4096
    listen_backlog: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 15.0
    send_min_bytes_per_s: int = 1024 * 1024  # 0 = no send deadline (server/send_deadline.py)
    grpc_max_message_bytes: int = 8 * 1024 * 1024
    grpc_max_connection_age_s: float = 600.0  # 0 = a gRPC connection lives as long as its client keeps it
    # client keepalive pings grpc takes (Triton's --grpc-keepalive-permit-without-calls,
    # --grpc-http2-min-recv-ping-interval-without-data, --grpc-http2-max-ping-strikes)
    grpc_keepalive_permit_without_calls: bool = True
    grpc_min_ping_interval_s: float = 5.0
    grpc_max_ping_strikes: int = 2  # 0 = no limit
    grpc_max_concurrent_streams: int = 250  # calls open at once on one gRPC connection (HTTP/2's cap)
    hold_refused_connections: bool = False
    shed_before_parsing: bool = True
    direct_infer: bool = True
    api_token: str = field(default="", repr=False)  # never printed; ACLSERVE_API_TOKEN wins
    auth_inference: bool = False
    tls_cert_file: str = ""  # PEM certificate chain: HTTPS and gRPC over TLS (server/tls.py); "" = plain
    tls_key_file: str = ""  # its private key (PEM)
    tls_client_ca_file: str = ""  # PEM CA certificates: clients must show a certificate they signed (mTLS)
    readiness: str = "strict"
    load_retry_initial_s: float = 1.0
    load_retry_max_s: float = 60.0
    shutdown_timeout_s: float = 30.0
    load_concurrency: int = 1
    cpu_threads: int = 1
    thread_scheduling: str = "inherited"  # thread_policy.py: as started, or SCHED_BATCH (batch)
    compile_cache_dir: str = ""  # "" = <models_dir>/.cache, else a user cache folder (repository/cache_dir.py)
    compile_timeout_s: float = DEFAULT_TIMEOUT_S  # a dropped .onnx's whole compile, ATC or CPU
    unload_on_delete: bool = True
    settle_s: float = 1.0
    debounce_s: float = 0.25
    memory_reserve_fraction: float = 0.1
    # (streams, events) per device; None for either = what the runtime knows for this device
    device_limits: tuple[int | None, int | None] = (None, None)
    images: ImageSettings = field(default_factory=ImageSettings)
    model_defaults: ModelConfig = field(default_factory=ModelConfig)
