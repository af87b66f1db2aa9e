"""The server's settings: a merged mapping -> ServerConfig (with its trace, device limits, images
and model defaults sections)."""
from __future__ import annotations

from typing import Callable, Mapping

from ..logs import FORMATS as LOG_FORMATS
from ..acl.soc_limits import MAX_EVENTS, MAX_STREAMS
from ..runtime.acl_runtime import MAX_CPU_THREADS
from ..trace.settings import TraceSettings, TraceSettingsError
from .checks import (MAX_MS, as_bool, as_float, as_int, as_mapping, as_str, is_auto, no_unknown, shown, text_hint,
                     unless_none)
from .keys import IMAGE_SETTINGS_KEYS, SERVER_KEYS
from .model import as_defaults, parse_model_config
from .schema import (CONTROL_MODES, DECODERS, DEVICES, GRPC_MIN_ARRIVING, LOG_LEVELS, READINESS, THREAD_SCHEDULING,
                     ConfigConflict, ConfigError, ImageSettings, ServerConfig)

C_INT = 2**31 - 1  # what uvloop's listen() and grpc's maximum_concurrent_rpcs take
MAX_S = MAX_MS / 1000  # the longest duration in seconds (grpc takes some in milliseconds, in a C int: 24.8 days)


def parse_server_config(data: Mapping, given: Callable[[str], bool] | None = None) -> ServerConfig:
    """Validate a complete server mapping (already merged over the embedded default). `given(key)`:
    whether a file or an override set `key` (files.load_server_settings knows); without it, a
    value other than the default's is taken for one set."""
    data = as_mapping(data, "")
    no_unknown(data, SERVER_KEYS, "")
    d = ServerConfig()
    get = lambda key: data.get(key, getattr(d, key))  # noqa: E731
    models_dir = as_str(get("models_dir"), "models_dir", allow_empty=False)
    cache_dir = as_str(unless_none(data.get("compile_cache_dir"), ""), "compile_cache_dir")
    token = unless_none(data.get("api_token"), "")  # (api_token: false or 0 read as no token)
    if not isinstance(token, str):
        # (the value is a secret: not echoed; `api_token: 12345` is a number to YAML)
        raise ConfigError("api_token", f"must be a string{text_hint(token)}")
    max_inflight = as_int(get("max_inflight_bytes"), "max_inflight_bytes", 1)
    tls_cert = as_str(unless_none(get("tls_cert_file"), ""), "tls_cert_file")
    tls_key = as_str(unless_none(get("tls_key_file"), ""), "tls_key_file")
    if bool(tls_cert) != bool(tls_key):
        raise ConfigConflict("tls_key_file" if tls_cert else "tls_cert_file",
                             "TLS needs both tls_cert_file and tls_key_file", ("tls_cert_file", "tls_key_file"))
    tls_client_ca = as_str(unless_none(get("tls_client_ca_file"), ""), "tls_client_ca_file")
    if tls_client_ca and not tls_cert:
        raise ConfigConflict("tls_client_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file",
                             ("tls_client_ca_file", "tls_cert_file"))
    initial_retry, max_retry = _load_retry(get)
    port, grpc_port = as_int(get("port"), "port", 0, 65535), as_int(get("grpc_port"), "grpc_port", 0, 65535)
    if port and port == grpc_port:  # (found at bind time otherwise, after the models had loaded)
        raise ConfigConflict("grpc_port", f"must differ from port ({port}); 0 turns gRPC off", ("port", "grpc_port"))
    max_body = as_int(get("max_body_bytes"), "max_body_bytes", 1)
    message = get("grpc_max_message_bytes")
    message_set = given("grpc_max_message_bytes") if given else message != d.grpc_max_message_bytes
    grpc_message = _grpc_max_message_bytes(message, message_set, grpc_port, max_body, max_inflight)
    max_request = _max_request_bytes(get("max_request_bytes"), max_inflight)
    return ServerConfig(
        host=_host(get("host")),
        port=port,
        grpc_port=grpc_port,
        models_dir=models_dir,
        device=as_str(get("device"), "device", DEVICES),
        log_level=as_str(get("log_level"), "log_level", LOG_LEVELS),
        log_format=as_str(get("log_format"), "log_format", LOG_FORMATS),
        request_log=as_bool(get("request_log"), "request_log"),
        trace=_trace(unless_none(data.get("trace"), {})),
        trace_dir=as_str(get("trace_dir"), "trace_dir", allow_empty=False),
        model_control_mode=as_str(get("model_control_mode"), "model_control_mode", CONTROL_MODES),
        max_body_bytes=max_body,
        max_inflate_ratio=as_int(get("max_inflate_ratio"), "max_inflate_ratio", 0),
        max_json_bytes=as_int(get("max_json_bytes"), "max_json_bytes", 1),
        max_json_elements=as_int(get("max_json_elements"), "max_json_elements", 1),
        max_request_bytes=max_request,
        max_inflight_bytes=max_inflight,
        max_inflight_bytes_per_model=_per_model_bytes(get("max_inflight_bytes_per_model"), max_inflight, max_request),
        max_connections=as_int(get("max_connections"), "max_connections", 1, C_INT),
        listen_backlog=as_int(get("listen_backlog"), "listen_backlog", 1, C_INT),
        header_timeout_s=as_float(get("header_timeout_s"), "header_timeout_s", 0.001, maximum=MAX_S),
        body_timeout_s=as_float(get("body_timeout_s"), "body_timeout_s", 0.001, maximum=MAX_S),
        keepalive_timeout_s=as_float(get("keepalive_timeout_s"), "keepalive_timeout_s", 0.001, maximum=MAX_S),
        send_min_bytes_per_s=as_int(get("send_min_bytes_per_s"), "send_min_bytes_per_s", 0),
        grpc_max_message_bytes=grpc_message,
        grpc_max_connection_age_s=as_float(get("grpc_max_connection_age_s"), "grpc_max_connection_age_s",
                                           maximum=MAX_S),
        grpc_keepalive_permit_without_calls=as_bool(get("grpc_keepalive_permit_without_calls"),
                                                    "grpc_keepalive_permit_without_calls"),
        grpc_min_ping_interval_s=as_float(get("grpc_min_ping_interval_s"), "grpc_min_ping_interval_s", maximum=MAX_S),
        grpc_max_ping_strikes=as_int(get("grpc_max_ping_strikes"), "grpc_max_ping_strikes", 0, C_INT),
        grpc_max_concurrent_streams=as_int(get("grpc_max_concurrent_streams"), "grpc_max_concurrent_streams", 1,
                                           C_INT),
        hold_refused_connections=as_bool(get("hold_refused_connections"), "hold_refused_connections"),
        shed_before_parsing=as_bool(get("shed_before_parsing"), "shed_before_parsing"),
        direct_infer=as_bool(get("direct_infer"), "direct_infer"),
        api_token=token,
        auth_inference=as_bool(get("auth_inference"), "auth_inference"),
        tls_cert_file=tls_cert,
        tls_key_file=tls_key,
        tls_client_ca_file=tls_client_ca,
        readiness=as_str(get("readiness"), "readiness", READINESS),
        load_retry_initial_s=initial_retry,
        load_retry_max_s=max_retry,
        shutdown_timeout_s=as_float(get("shutdown_timeout_s"), "shutdown_timeout_s", maximum=MAX_S),
        load_concurrency=as_int(get("load_concurrency"), "load_concurrency", 1),
        cpu_threads=as_int(get("cpu_threads"), "cpu_threads", 1, MAX_CPU_THREADS),
        thread_scheduling=as_str(get("thread_scheduling"), "thread_scheduling", THREAD_SCHEDULING),
        compile_cache_dir=cache_dir,
        compile_timeout_s=as_float(get("compile_timeout_s"), "compile_timeout_s", 0.001, maximum=MAX_S),
        unload_on_delete=as_bool(get("unload_on_delete"), "unload_on_delete"),
        settle_s=as_float(get("settle_s"), "settle_s", maximum=MAX_S),
        debounce_s=as_float(get("debounce_s"), "debounce_s", maximum=MAX_S),
        memory_reserve_fraction=as_float(get("memory_reserve_fraction"), "memory_reserve_fraction", 0.0, 1.0),
        device_limits=_device_limits(unless_none(data.get("device_limits"), {})),
        images=_image_settings(data.get("images")),
        model_defaults=as_defaults(parse_model_config(data.get("model_defaults", {}), "model_defaults")),
    )


def _host(value) -> str:
    """The address to listen on. An IPv6 address in brackets, as a URL writes it (`[::1]`), was
    refused only at the bind: "cannot listen on [[::1]]:8000: Name or service not known"."""
    host = as_str(value, "host", allow_empty=False)
    if host.startswith("[") and "]" in host:
        address, after = host[1:].split("]", 1)
        port = " (and the port in port)" if after else ""
        raise ConfigError("host", f"an IPv6 address goes without brackets here: write {address}{port}, "
                                  f"got {shown(host)}")
    return host


def _max_request_bytes(value, max_inflight: int) -> int:
    """At most max_inflight_bytes, which sets the bound: the refusal names it (a bare "must be
    <= 536870912" left the operator to find which setting that was)."""
    value = as_int(value, "max_request_bytes", 1)
    if value > max_inflight:
        raise ConfigConflict("max_request_bytes", f"must be <= max_inflight_bytes ({max_inflight}): raise that too, "
                                                  f"got {value}", ("max_request_bytes", "max_inflight_bytes"))
    return value


def _per_model_bytes(value, max_inflight: int, max_request: int) -> int:
    """0 for `auto`; else between max_request_bytes (a request that fits its own limit must fit
    its model's share when nothing else is held) and max_inflight_bytes, each refusal naming the
    other key, as max_request_bytes' does."""
    if is_auto(value):
        return 0
    key = "max_inflight_bytes_per_model"
    value = as_int(value, key, 0)  # (0 too is below max_request_bytes: that message names auto)
    if value < max_request:
        raise ConfigConflict(key, f"must be >= max_request_bytes ({max_request}): a request that fits that must fit "
                                  f"its model's share; lower that too, or write auto, got {value}",
                             (key, "max_request_bytes"))
    if value > max_inflight:
        raise ConfigConflict(key, f"must be <= max_inflight_bytes ({max_inflight}): raise that too, got {value}",
                             (key, "max_inflight_bytes"))
    return value


def _grpc_max_message_bytes(value, is_set: bool, grpc_port: int, max_body: int, max_inflight: int) -> int:
    """With gRPC on, a value set at most max_body_bytes (it was lowered to that without a word, though
    the default's comment says to raise it for bigger tensors), and at most max_inflight_bytes /
    GRPC_MIN_ARRIVING: that many messages may be arriving at once, before they can be charged
    (server/grpc_arrivals.py), and what they hold stays within max_inflight_bytes. The default
    is lowered to fit them: a config lowering max_body_bytes alone was refused for it. Set is set
    whatever its value: a copy of default.yaml, its budget lowered, was lowered unsaid (a tester)."""
    value = as_int(value, "grpc_max_message_bytes", 1)
    if not grpc_port:
        return value  # (not used)
    if not is_set:  # the default: lowered to fit what the file lowered
        return max(1, min(value, max_body, max_inflight // GRPC_MIN_ARRIVING))
    if value > max_body:
        raise ConfigConflict("grpc_max_message_bytes", f"must be <= max_body_bytes ({max_body}): raise that too "
                                                       f"or lower this, got {value}",
                             ("grpc_max_message_bytes", "max_body_bytes"))
    if value > max_inflight // GRPC_MIN_ARRIVING:
        fits = max_inflight // GRPC_MIN_ARRIVING
        raise ConfigConflict("grpc_max_message_bytes",
                             f"must be <= max_inflight_bytes / {GRPC_MIN_ARRIVING} ({fits}): {GRPC_MIN_ARRIVING} gRPC "
                             "messages may be arriving at once (two streams, two calls): raise max_inflight_bytes too "
                             f"or lower this, got {value}", ("grpc_max_message_bytes", "max_inflight_bytes"))
    return value


def _load_retry(get) -> tuple[float, float]:
    """The first and the longest wait between load retries: a refusal names both keys and where
    each came from (the user may have set either, or both)."""
    initial = as_float(get("load_retry_initial_s"), "load_retry_initial_s", maximum=MAX_S)
    longest = as_float(get("load_retry_max_s"), "load_retry_max_s", maximum=MAX_S)
    if initial > longest:
        raise ConfigConflict("load_retry_max_s", f"must be >= load_retry_initial_s ({initial:.10g}), "
                                                 f"got {longest:.10g}", ("load_retry_initial_s", "load_retry_max_s"))
    return initial, longest


_TRACE_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count",
               "log_frequency": "log_frequency", "file": "trace_file", "format": "trace_format"}
_TRACE_NUMBERS = ("rate", "count", "log_frequency")  # integers, as every number of the file ("10" is text)
# YAML 1.1 reads a bare OFF as false: the level's own hint, as false is no level
_OFF_UNQUOTED = " (write \"OFF\" in quotes: YAML reads a bare OFF as false)"


def _trace(value) -> TraceSettings:
    """The file's trace section: each key's type judged here, as every other key's (the trace API's
    values are strings and lists, Triton's: TraceSettings took `file: 0x10` as the file "16" and a
    list for any key); its values then by TraceSettings, as the API's are."""
    data = as_mapping(value, "trace")
    no_unknown(data, _TRACE_KEYS, "trace")
    settings = TraceSettings()
    for key, item in data.items():
        path = f"trace.{key}"
        if key in _TRACE_NUMBERS:
            as_int(item, path)
        elif not isinstance(item, str):  # (a number, a date or a boolean YAML read unquoted; a list; null)
            hint = _OFF_UNQUOTED if item is False and key == "level" else text_hint(item) if key == "file" else ""
            raise ConfigError(path, f"must be a string, got {shown(item)}{hint}")
        try:
            settings = settings.updated({_TRACE_KEYS[key]: item})
        except TraceSettingsError as e:
            raise ConfigError(path, str(e).split(": ", 1)[-1]) from None
    return settings


def _device_limits(value) -> tuple[int | None, int | None]:
    data = as_mapping(value, "device_limits")
    no_unknown(data, {"streams", "events"}, "device_limits")
    streams, events = data.get("streams"), data.get("events")
    # no device allows more: the ledger would let through what none holds (a record short of events
    # hangs; a stream past the device's is refused by create_stream as the load's instances start)
    return (None if streams is None else as_int(streams, "device_limits.streams", 1, MAX_STREAMS),
            None if events is None else as_int(events, "device_limits.events", 1, MAX_EVENTS))


def _image_settings(data) -> ImageSettings:
    data = as_mapping(unless_none(data, {}), "images")
    no_unknown(data, IMAGE_SETTINGS_KEYS, "images")
    d = ImageSettings()
    return ImageSettings(
        workers=as_int(data.get("workers", d.workers), "images.workers", 0, 256),
        max_pending=as_int(data.get("max_pending", d.max_pending), "images.max_pending", 1),
        max_pixels=as_int(data.get("max_pixels", d.max_pixels), "images.max_pixels", 1),
        max_side=as_int(data.get("max_side", d.max_side), "images.max_side", 1, 65535),
        max_scan_pixels=as_int(data.get("max_scan_pixels", d.max_scan_pixels), "images.max_scan_pixels", 1),
        decoder=as_str(data.get("decoder", d.decoder), "images.decoder", DECODERS),
        dvpp_device=as_int(data.get("dvpp_device", d.dvpp_device), "images.dvpp_device", 0),
    )
