"""Config loading: defaults, merging, overrides, and every error naming its dotted path."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from aclserve.config import (DEFAULT_CONFIG_PATH, ConfigError, ModelConfig, load_model_config, load_server_settings,
                             load_server_config, model_config_mapping, parse_model_config)
from aclserve.scheduling.policy import QueuePolicy
from tests import REPO


def write(tmp_path, text: str, name="c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_repo_root_default_is_byte_identical_to_the_embedded_one():
    assert (REPO / "configs" / "default.yaml").read_bytes() == DEFAULT_CONFIG_PATH.read_bytes()


def test_embedded_default_matches_the_dataclass_defaults():
    config = load_server_config()
    assert config.host == "127.0.0.1" and config.port == 8000 and config.model_control_mode == "poll"
    assert config.grpc_port == 8001
    assert (config.max_json_bytes, config.max_json_elements) == (16 << 20, 1 << 20)
    assert config.compile_cache_dir == ""  # resolved when an .onnx is compiled (repository/cache_dir.py)
    assert config.compile_timeout_s == 3600  # (a compile of a model whose test runs never end was not bounded)
    assert config.model_defaults == ModelConfig()
    assert config.model_defaults.reset_timeout_ms == 10_000
    assert config.readiness == "strict" and config.max_request_bytes <= config.max_inflight_bytes
    assert config.thread_scheduling == "inherited"


def test_every_default_key_is_documented_by_a_comment():
    lines = DEFAULT_CONFIG_PATH.read_text().splitlines()
    keys = [(i, line) for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    assert len(keys) > 30
    for i, line in keys:
        assert lines[i - 1].lstrip().startswith("#"), f"line {i + 1} has no comment above it: {line}"


def test_file_merges_over_default_and_overrides_win(tmp_path):
    path = write(tmp_path, "port: 9000\nmodel_defaults:\n  batching:\n    max_queue_delay_ms: 5\n")
    config = load_server_config(path, {"port": 9100, "model_defaults.instances": 3, "host": None})
    assert config.port == 9100
    assert config.host == "127.0.0.1"
    assert config.model_defaults.instances == 3
    assert config.model_defaults.batching.max_queue_delay_ms == 5.0
    assert config.model_defaults.batching.priority_levels == 3  # untouched default kept


@pytest.mark.parametrize("text", ["model_defaults:\n", "model_defaults: {compile: null, batching: null}\n",
                                  "images:\ntrace:\ndevice_limits:\n",
                                  "model_defaults:\n  # instances: 2 (every line of the section commented out)\n"])
def test_a_section_left_empty_keeps_the_defaults(tmp_path, text):
    """`model_defaults:` with every line under it commented out is null: it was refused ("must be
    a mapping, got None") where `images:` and `trace:` were taken as empty (an operator's check)."""
    assert load_server_config(write(tmp_path, text)) == load_server_config(None)
    defaults = load_server_config(None).model_defaults
    assert load_model_config(write(tmp_path, "batching:\ninputs:\n", "m.yaml"), defaults) == defaults


def test_a_null_that_is_a_value_still_turns_an_inherited_setting_off(tmp_path):
    """Only sections of settings keep their defaults when null: a model's `image:` null turns
    off the image input model_defaults gives it, and `priority_queue_policy:` null clears the
    inherited per-level policies (both were lost for a while: a review)."""
    defaults = load_server_config(None, {"model_defaults.inputs": {"x": {"image": {"color": "gray"}}},
                                         "model_defaults.batching.priority_queue_policy": {
                                             "3": {"max_queue_size": 4}}}).model_defaults
    assert defaults.inputs["x"].image is not None and 3 in defaults.batching.priority_queue_policy
    config = load_model_config(write(tmp_path, "inputs: {x: {image: }}\nbatching:\n  priority_levels: 2\n"
                                               "  priority_queue_policy:\n", "m.yaml"), defaults)
    assert config.inputs["x"].image is None and config.batching.priority_queue_policy == {}


def test_a_choice_is_taken_in_any_case():
    """log_level: INFO and readiness: Strict were refused where ACLSERVE_DEVICE=CPU was taken."""
    config = load_server_config(None, {"log_level": "INFO", "readiness": "Strict", "model_control_mode": "POLL",
                                       "thread_scheduling": "Batch",
                                       "model_defaults.inputs": {"x": {"image": {"layout": "nchw", "invert": "AUTO"}}},
                                       "model_defaults.slots": "Auto",
                                       "model_defaults.batching": {"default_priority": "AUTO", "default_queue_policy": {
                                           "max_queue_size": "Auto", "default_timeout_ms": "AUTO"}}})
    assert (config.log_level, config.readiness, config.model_control_mode) == ("info", "strict", "poll")
    assert config.thread_scheduling == "batch"
    assert config.model_defaults.inputs["x"].image.layout == "NCHW"
    image, defaults = config.model_defaults.inputs["x"].image, config.model_defaults
    assert image.invert == "auto" and defaults.slots == 0  # (auto, once parsed)
    assert defaults.batching.default_priority is None
    assert (defaults.batching.default_queue_policy.max_queue_size,
            defaults.batching.default_queue_policy.default_timeout_ms) == (None, None)


@pytest.mark.parametrize("overrides, path, fragment", [
    ({"model_defaults.batching.max_queue_delay_ms": -1}, "model_defaults.batching.max_queue_delay_ms",
     "must be >= 0, got -1"),
    ({"prot": 1}, "prot", "unknown key"),
    ({"port": 70000}, "port", "must be <= 65535"),
    # (a number is quoted as written: at :.10g, 99999999999 read "1e+11")
    ({"model_defaults.batching.default_queue_policy.default_timeout_ms": 99999999999},
     "model_defaults.batching.default_queue_policy.default_timeout_ms", "must be <= 2147483647, got 99999999999"),
    ({"port": "80"}, "port", "must be an integer"),
    ({"port": True}, "port", "must be an integer"),
    ({"grpc_port": -1}, "grpc_port", "must be >= 0"),
    ({"grpc_port": 65536}, "grpc_port", "must be <= 65535"),
    ({"port": 9000, "grpc_port": 9000}, "grpc_port", "must differ from port (9000)"),  # a CLI review: found at bind
    ({"max_json_bytes": 0}, "max_json_bytes", "must be >= 1"),
    ({"max_json_elements": "many"}, "max_json_elements", "must be an integer"),
    ({"model_control_mode": "watch"}, "model_control_mode", "must be one of poll, explicit, none"),
    ({"unload_on_delete": "yes"}, "unload_on_delete", "must be true or false"),
    ({"memory_reserve_fraction": 1.0}, "memory_reserve_fraction", "must be < 1"),
    ({"model_defaults.slots": 0}, "model_defaults.slots", "must be >= 1, got 0"),
    ({"model_defaults.reset_timeout_ms": 0}, "model_defaults.reset_timeout_ms", "must be >= 1, got 0"),
    ({"model_defaults.reset_timeout_ms": "10s"}, "model_defaults.reset_timeout_ms", "must be an integer"),
    # found by an independent check: these were accepted, then took the server's memory (the
    # levels), answered /config 500 (integers past 64 bits) or failed the load inside pyACL
    ({"model_defaults.batching.priority_levels": 100_000_000}, "model_defaults.batching.priority_levels",
     "must be <= 1000"),
    ({"model_defaults.batching.default_queue_policy.default_timeout_ms": 99999999999999999999},
     "model_defaults.batching.default_queue_policy.default_timeout_ms", "must be <= 2147483647"),
    # a deadline under a microsecond: /config's default_timeout_microseconds showed 0 (no deadline)
    # while every request timed out (a tester's find)
    ({"model_defaults.batching.default_queue_policy.default_timeout_ms": 0.0004},
     "model_defaults.batching.default_queue_policy.default_timeout_ms",
     "is under a microsecond, which /config's default_timeout_microseconds (Triton's unit) would show as 0"),
    ({"model_defaults.batching.priority_queue_policy": {2: {"default_timeout_ms": 0.0009}}},
     "model_defaults.batching.priority_queue_policy.2.default_timeout_ms", "give 0 for no deadline, or at least "
     "0.001, got 0.0009"),
    ({"model_defaults.batching.max_queue_delay_ms": 1e20}, "model_defaults.batching.max_queue_delay_ms",
     "must be <= 2147483647"),
    ({"model_defaults.execution_timeout_ms": 3_000_000_000}, "model_defaults.execution_timeout_ms",
     "must be <= 2147483647"),
    ({"model_defaults.batching.max_queue_delay_ms": "1e9"}, "model_defaults.batching.max_queue_delay_ms",
     "write 1000000000, or 1.0e+9"),
    ({"port": "18310"}, "port", "a number in quotes is text: write it without quotes"),
    # a quoted decimal was told "YAML reads a number like 1e9 as text"; a quoted trace.rate was
    # taken, alone of the file's numbers (an audit's findings)
    ({"debounce_s": "0.25"}, "debounce_s", "got '0.25' (a number in quotes is text: write it without quotes)"),
    ({"model_defaults.inputs": {"x": {"image": {"crop_fraction": " .5"}}}},
     "model_defaults.inputs.x.image.crop_fraction", "(a number in quotes is text: write it without quotes)"),
    ({"trace": {"rate": "10"}}, "trace.rate", "must be an integer, got '10' (a number in quotes is text"),
    ({"trace": {"log_frequency": "1_000"}}, "trace.log_frequency", "(a number in quotes is text"),
    # found by a helper's fuzz of the config: accepted, then a traceback from grpc or uvloop (C
    # ints), or a load that never ended (instances built one after another)
    ({"grpc_max_connection_age_s": 2_592_000}, "grpc_max_connection_age_s", "must be <= 2147483.647"),
    ({"keepalive_timeout_s": 1e300}, "keepalive_timeout_s", "must be <= 2147483.647"),
    # grpc takes these as C ints (the interval in ms), and a negative strike count as 0: no limit
    ({"grpc_min_ping_interval_s": 1e300}, "grpc_min_ping_interval_s", "must be <= 2147483.647"),
    ({"grpc_min_ping_interval_s": -1}, "grpc_min_ping_interval_s", "must be >= 0"),
    ({"grpc_max_ping_strikes": -1}, "grpc_max_ping_strikes", "must be >= 0, got -1"),
    ({"grpc_max_ping_strikes": 2**31}, "grpc_max_ping_strikes", "must be <= 2147483647"),
    # 0 streams a connection: no call at all
    ({"grpc_max_concurrent_streams": 0}, "grpc_max_concurrent_streams", "must be >= 1, got 0"),
    ({"grpc_max_concurrent_streams": 2**31}, "grpc_max_concurrent_streams", "must be <= 2147483647"),
    ({"grpc_keepalive_permit_without_calls": 1}, "grpc_keepalive_permit_without_calls", "must be true or false"),
    # (not both 2.14748e+06)
    ({"shutdown_timeout_s": 2147484}, "shutdown_timeout_s", "must be <= 2147483.647, got 2147484"),
    ({"settle_s": 1e300}, "settle_s", "must be <= 2147483.647"),  # (files never picked up)
    ({"settle_s": 2**1024 - 1}, "settle_s", "must be a number (at most 1.8e+308)"),  # (past float, bit_length 1024)
    ({"shutdown_timeout_s": 10**400}, "shutdown_timeout_s", "must be a number (at most 1.8e+308)"),
    ({"listen_backlog": 2**31}, "listen_backlog", "must be <= 2147483647"),
    ({"tls_cert_file": "a\x00b"}, "tls_cert_file", "must not contain a NUL character"),
    # a wrong type's false value was taken for none: no token, TLS off (a helper's fuzz)
    ({"api_token": False}, "api_token", "must be a string"),
    ({"tls_cert_file": []}, "tls_cert_file", "must be a string, got []"),
    ({"images": []}, "images", "must be a mapping, got []"),
    ({"model_defaults.outputs": {"y": []}}, "model_defaults.outputs.y", "must be a mapping, got []"),
    ({"compile_cache_dir": "\x00"}, "compile_cache_dir", "must not contain a NUL character"),
    ({"max_connections": 10**19}, "max_connections", "must be <= 2147483647"),
    ({"cpu_threads": 10**19}, "cpu_threads", "must be <= 1024"),
    ({"model_defaults.instances": 10**12}, "model_defaults.instances", "must be <= 1024"),
    # taken, then refused at the load ("needs ... 600000000000000000000 events"; a tester)
    ({"model_defaults.slots": 99999999999999999999}, "model_defaults.slots", "must be <= 10921"),
    # taken: no device has more than 65535 events (runtime/limits.py), so the count meant nothing
    ({"device_limits": {"events": 65536}}, "device_limits.events", "must be <= 65535, got 65536"),
    ({"device_limits": {"events": 10**30}}, "device_limits.events", "must be <= 65535"),
    # taken (a C int's worth): no device has more than 2048 streams (acl/soc_limits.py, the training series)
    ({"device_limits": {"streams": 2049}}, "device_limits.streams", "must be <= 2048, got 2049"),
    ({"device_limits": {"streams": 10**30}}, "device_limits.streams", "must be <= 2048"),
    ({"model_defaults.batching.priority_queue_policy": {"\u00b2": {"max_queue_size": 5}}},
     "model_defaults.batching.priority_queue_policy.\u00b2", "must be an integer"),
    ({"model_defaults.batching.priority_queue_policy": {1: {"max_queue_size": 5}, "1": {"max_queue_size": 6}}},
     "model_defaults.batching.priority_queue_policy.1", "gives level 1 a second time"),
    ({"model_defaults.batching.priority_queue_policy": []}, "model_defaults.batching.priority_queue_policy",
     "must be a mapping"),
    # (the bound's setting named: a bare "must be <= 536870912" left the operator to find it)
    ({"max_request_bytes": 2 << 30}, "max_request_bytes", "must be <= max_inflight_bytes (536870912): raise that too, "
                                                         "got 2147483648"),
    # a share under max_request_bytes would refuse a request its own limit takes, with nothing else held
    ({"max_inflight_bytes_per_model": 100 << 20}, "max_inflight_bytes_per_model",
     "must be >= max_request_bytes (268435456): a request that fits that must fit its model's share; lower that "
     "too, or write auto, got 104857600"),
    ({"max_inflight_bytes_per_model": 1 << 30}, "max_inflight_bytes_per_model",
     "must be <= max_inflight_bytes (536870912): raise that too, got 1073741824"),
    ({"max_inflight_bytes_per_model": "half"}, "max_inflight_bytes_per_model", "must be an integer"),
    # (0 is what auto parses to, not a way to write it: said so, where "must be >= 1" named no auto)
    ({"max_inflight_bytes_per_model": 0}, "max_inflight_bytes_per_model",
     "must be >= max_request_bytes (268435456): a request that fits that must fit its model's share; lower that "
     "too, or write auto, got 0"),
    ({"readiness": "maybe"}, "readiness", "must be one of strict, lenient"),
    ({"thread_scheduling": "fifo"}, "thread_scheduling", "must be one of batch, inherited"),
    ({"load_retry_max_s": 0.5}, "load_retry_max_s", "must be >= load_retry_initial_s (1), got 0.5"),
    ({"load_retry_initial_s": 100}, "load_retry_max_s", "must be >= load_retry_initial_s (100), got 60"),
    # (the value not echoed: a secret; YAML's number said, as a number where text goes is)
    ({"api_token": 12345}, "api_token", "must be a string (YAML reads it as a number: write it in quotes for text)"),
    ({"api_token": True}, "api_token", "must be a string (YAML reads it as a boolean: write it in quotes for text)"),
    ({"header_timeout_s": 0}, "header_timeout_s", "must be >= 0.001"),
    ({"compile_timeout_s": 0}, "compile_timeout_s", "must be >= 0.001"),
    ({"model_defaults.devices": []}, "model_defaults.devices", "non-empty list"),
    ({"model_defaults.devices": [0, -1]}, "model_defaults.devices[1]", "must be >= 0"),
    ({"images.dvpp_device": -1}, "images.dvpp_device", "must be >= 0"),
    ({"model_defaults.batching.colour": 1}, "model_defaults.batching.colour", "unknown key"),
    ({"model_defaults.batching.batch_formation": "eager"}, "model_defaults.batching.batch_formation",
     "must be one of just_in_time, when_slot_free"),
    ({"model_defaults.batching.default_priority": 4}, "model_defaults.batching.default_priority",
     "must be <= priority_levels (3)"),
    ({"model_defaults.batching.default_priority": 0}, "model_defaults.batching.default_priority", "must be >= 1"),
    ({"model_defaults.batching.priority_queue_policy": {5: {"max_queue_size": 1}}},
     "model_defaults.batching.priority_queue_policy.5", "names a level past priority_levels (3)"),
    ({"model_defaults.batching.priority_queue_policy": {1: {"timeout_action": "drop"}}},
     "model_defaults.batching.priority_queue_policy.1.timeout_action", "reject, delay"),
    ({"model_defaults.batching.default_queue_policy.max_queue_size": -2},
     "model_defaults.batching.default_queue_policy.max_queue_size", "must be >= 0"),
    # Triton's ModelQueuePolicy.max_queue_size is a uint32: gRPC's ModelConfig failed INTERNAL past it
    ({"model_defaults.batching.default_queue_policy.max_queue_size": 2**32},
     "model_defaults.batching.default_queue_policy.max_queue_size", "must be <= 4294967295"),
    ({"model_defaults.version_policy": {"newest": 1}}, "model_defaults.version_policy.newest",
     "unknown version policy"),
    ({"model_defaults.version_policy": {"latest": 0}}, "model_defaults.version_policy.latest", "must be >= 1"),
    ({"model_defaults.version_policy": {"specific": [1, 1]}}, "model_defaults.version_policy.specific", "duplicates"),
    # past Triton's uint32 num_versions, and past a version folder's 18 digits: every model's /config answered 500
    ({"model_defaults.version_policy": {"latest": 2**32}}, "model_defaults.version_policy.latest",
     "must be <= 4294967295, got 4294967296"),
    ({"model_defaults.version_policy": {"specific": [1, 10**18]}}, "model_defaults.version_policy.specific[1]",
     "must be <= 999999999999999999 (a version is named by its folder, a positive integer of at most 18 digits)"),
    ({"model_defaults.compile.batch": [0]}, "model_defaults.compile.batch[0]", "must be >= 1"),
    # past ATC's documented range: refused by the compile at each load, or, a size the host's memory
    # holds, allocated by its test run (a tester, t92)
    ({"model_defaults.compile.batch": [1, 100_000_000]}, "model_defaults.compile.batch[1]",
     "must be <= 2048, the largest ATC documents for --dynamic_batch_size, got 100000000"),
    # these two were taken, and every .onnx then failed its compile, naming neither model_defaults nor the file
    ({"model_defaults.compile.precision_mode": "bogus"}, "model_defaults.compile.precision_mode",
     "'bogus' is not one ATC takes: force_fp16, force_fp32, "),
    ({"model_defaults.compile.input_shape": "garbage"}, "model_defaults.compile.input_shape",
     "malformed entry 'garbage': expected name:d0,d1,... with integer dims"),
    ({"model_defaults.compile.input_shape": "x:1;x:2"}, "model_defaults.compile.input_shape", "names input 'x' twice"),
    ({"model_defaults": 3}, "model_defaults", "must be a mapping"),
    # a BatchingConfig field no YAML sets (what a model's own file gives; it was taken, and ignored)
    ({"model_defaults.batching.own_keys": ["max_batch_size"]}, "model_defaults.batching.own_keys", "unknown key"),
    ({"model_defaults.batching.priority_queue_fields": {}}, "model_defaults.batching.priority_queue_fields",
     "unknown key"),
    # model_defaults' own preserve_ordering with the default's three levels: set priority_levels: 1 beside it
    ({"model_defaults.batching.preserve_ordering": True}, "model_defaults.batching.preserve_ordering",
     "takes one priority level, not 3 (model_defaults.batching.priority_levels)"),
])
def test_errors_name_the_dotted_path(overrides, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_server_config(None, overrides)
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


CHANNELS = "a picture has 1 channel (gray) or 3 (rgb, bgr), so give 1 value (for every channel) or 3 (one per channel)"


@pytest.mark.parametrize("image, said", [
    ("{mean: [1, 2]}", "{file}: model_defaults.inputs.x.image.mean: has 2 values: " + CHANNELS),
    ("{std: [50, 50, 50, 50]}", "{file}: model_defaults.inputs.x.image.std: has 4 values: " + CHANNELS),
    ("{color: gray, mean: [1, 2, 3]}", "model_defaults.inputs.x.image.mean: has 3 values for color gray, which has "
     "1 channel: give 1 (model_defaults.inputs.x.image.color from {file}, model_defaults.inputs.x.image.mean from "
     "{file})"),
    ("{std: 1.0e-39}", "model_defaults.inputs.x.image.std: with std [1e-39], pixels 0-255 become values up to "
     "2.55e+41 in size, beyond FP32's largest, 3.40282e+38, that of every input an image may feed; mean and std are "
     "in pixel units, 0-255 (model_defaults.inputs.x.image.std from {file})"),
])
def test_an_image_mean_or_std_no_model_could_take_is_refused_when_the_config_is_read(tmp_path, image, said):
    """model_defaults' `mean: [1, 2]` (every picture has 1 or 3 channels) was taken, then passed
    over model by model as each loaded (found in review): what no model input could take is
    refused with the server config, naming it and where it came from."""
    path = write(tmp_path, f"model_defaults:\n  inputs:\n    x: {{image: {image}}}\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value) == said.format(file=path)


def test_a_models_image_mean_no_model_could_take_is_refused_as_its_file_is_read(tmp_path):
    """The same in a model's file, whose values may meet model_defaults': each named by its origin."""
    server = write(tmp_path, "model_defaults:\n  inputs:\n    x: {image: {mean: [1, 2, 3]}}\n", "s.yaml")
    defaults = load_server_config(server)
    for text, said in (("inputs: {y: {image: {std: [1, 2]}}}",
                        "{model}: inputs.y.image.std: has 2 values: " + CHANNELS),
                       ("inputs: {x: {image: {color: gray}}}", "inputs.x.image.mean: has 3 values for color gray, "
                        "which has 1 channel: give 1 (inputs.x.image.color from {model}, inputs.x.image.mean from "
                        "the server config's model_defaults ({server}))")):
        model = write(tmp_path, text + "\n", "m.yaml")
        with pytest.raises(ConfigError) as info:
            load_model_config(model, defaults.model_defaults)
        assert str(info.value) == said.format(model=model, server=server)


def test_file_errors_name_the_file(tmp_path):
    path = write(tmp_path, "model_defaults:\n  batching:\n    max_queue_delay_ms: -1\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value) == f"{path}: model_defaults.batching.max_queue_delay_ms: must be >= 0, got -1"


@pytest.mark.parametrize("overrides, said", [
    ({"cpu_threads": 0}, "cpu_threads: must be >= 1, got 0"),
    ({"model_defaults.batching.max_batch_size": -1}, "model_defaults.batching.max_batch_size: must be >= 0"),
])
def test_a_bad_override_is_not_blamed_on_the_file(tmp_path, overrides, said):
    """`aclserve serve --config p.yaml --cpu-threads 0` said "p.yaml: cpu_threads: must be >= 1":
    the value came from the command line. (Settings that do not go together name where each
    value came from: test_config_origins.py.)"""
    path = write(tmp_path, "port: 8100\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path, overrides)
    assert str(info.value).startswith(f"command line: {said}") and str(path) not in str(info.value)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: cpu_threads"):  # the file's own: the file
        load_server_config(write(tmp_path, "cpu_threads: 0\n"), {"port": 9000})


def test_an_unknown_key_is_named_on_one_bounded_line(tmp_path):
    """An unknown key went into the error as written: a newline in it split the load failure's
    log line in two, and a key of 100,000 characters was the whole message."""
    for key, named in (("bad\nkey", "'bad\\nkey'"), ("k" * 100_000, "'kkkkkk"), ("colour", "colour")):
        with pytest.raises(ConfigError) as info:
            load_server_config(None, {"trace": {key: 1}})
        said = str(info.value)
        assert said.startswith(f"trace.{named}") and "unknown key" in said, said[:200]
        assert "\n" not in said and len(said) < 400, said[:200]


def test_yaml_that_explodes_or_recurses_is_one_short_line(tmp_path):
    """Found by a helper's fuzz of the config: a 420-byte alias bomb quoted whole in the message
    (a billion strings: the memory ran out), 100,000 nested lists (RecursionError) and a
    5,000-digit integer (ValueError) were tracebacks."""
    levels = ["&k0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"&k{i} [" + ", ".join([f"*k{i - 1}"] * 10) + "]" for i in range(1, 9)]
    for text, fragment in (("host: [" + ", ".join(levels) + "]\n", "host: must be a non-empty string"),
                           ("host: " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
                           ("port: " + "9" * 5000, "Exceeds the limit (4300 digits)")):
        with pytest.raises(ConfigError, match=None) as info:
            load_server_config(write(tmp_path, text))
        assert fragment in str(info.value) and len(str(info.value)) < 500, str(info.value)[:600]


def test_invalid_yaml_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load_server_config(write(tmp_path, "port: [1,\n"))
    assert "\n" not in str(info.value) and "line 2, column 1" in str(info.value)  # one line, where
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_server_config(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_server_config(tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_where_it_is(tmp_path):
    """PyYAML keeps the last of two equal keys: the first setting was dropped without a word."""
    text = "port: 8100\nmodel_defaults:\n  instances: 2\n  instances: 1\n"
    with pytest.raises(ConfigError, match="the key 'instances' is given twice") as info:
        load_server_config(write(tmp_path, text))
    assert "line 4, column 3" in str(info.value) and "\n" not in str(info.value)
    # keys a `<<` merge brings in are meant to be overridden
    merged = "model_defaults:\n  <<: {instances: 2, reset_timeout_ms: 900}\n  instances: 3\n"
    defaults = load_server_config(write(tmp_path, merged)).model_defaults
    assert (defaults.instances, defaults.reset_timeout_ms) == (3, 900)
    # and a mapping that overrides a merged key, itself merged elsewhere (a review found it
    # refused: the check saw it after PyYAML had flattened it in place)
    nested = ("model_defaults:\n  batching:\n    priority_levels: 2\n    priority_queue_policy:\n"
              "      1: &urgent\n        <<: {timeout_action: reject, default_timeout_ms: 100}\n"
              "        default_timeout_ms: 50\n    default_queue_policy:\n      <<: *urgent\n")
    batching = load_server_config(write(tmp_path, nested)).model_defaults.batching
    assert batching.default_queue_policy.default_timeout_ms == 50
    assert batching.priority_queue_policy[1].default_timeout_ms == 50


def test_priority_levels_inherit_from_default_queue_policy():
    config = load_server_config(None, {"model_defaults.batching": {
        "default_queue_policy": {"default_timeout_ms": 100, "timeout_action": "delay"},
        "priority_queue_policy": {1: {"max_queue_size": 7}, "3": {"timeout_action": "reject"}}}})
    batching = config.model_defaults.batching
    assert batching.policy_for(1).max_queue_size == 7
    assert batching.policy_for(1).default_timeout_ms == 100 and batching.policy_for(1).timeout_action == "delay"
    assert batching.policy_for(3).timeout_action == "reject" and batching.policy_for(3).default_timeout_ms == 100
    assert batching.policy_for(2).max_queue_size is None  # auto: the default, resolved at load


def test_a_models_default_queue_policy_reaches_the_levels_model_defaults_gives(tmp_path):
    """A level's unset fields come from the default_queue_policy of all layers merged: a model's
    own default timeout reached its levels but not those of model_defaults, whose unset fields
    were fixed at the server's (an operator's audit). What a level sets stays its own."""
    defaults = load_server_config(None, {"model_defaults.batching.priority_queue_policy": {
        2: {"max_queue_size": 100}, 3: {"default_timeout_ms": 7}}}).model_defaults
    path = write(tmp_path, "batching: {max_batch_size: 1, default_queue_policy: "
                           "{default_timeout_ms: 100, timeout_action: delay}}\n", "m.yaml")
    batching = load_model_config(path, defaults).batching
    assert batching.policy_for(2) == QueuePolicy(max_queue_size=100, default_timeout_ms=100, timeout_action="delay")
    assert batching.policy_for(3) == QueuePolicy(max_queue_size=None, default_timeout_ms=7, timeout_action="delay")
    assert batching.policy_for(1) == batching.default_queue_policy
    # a level both give merges field by field ('2', quoted, is level 2 too: it was "given twice")
    path = write(tmp_path, "batching:\n  priority_queue_policy: {'2': {allow_timeout_override: false}}\n", "m.yaml")
    assert load_model_config(path, defaults).batching.policy_for(2) == QueuePolicy(
        max_queue_size=100, default_timeout_ms=None, allow_timeout_override=False)


def test_levels_only_model_defaults_gives_past_a_models_priority_levels_are_left_out(tmp_path):
    """`priority_levels: 1` in a model's file was refused with "batching.priority_queue_policy.2:
    must be <= 1", a key not in that file: model_defaults' level 2 has no queue in that model. It
    is left out, said in a note; a level the file gives itself past its levels is still refused."""
    defaults = load_server_config(None, {"model_defaults.batching.priority_queue_policy": {
        1: {"max_queue_size": 5}, 2: {"max_queue_size": 100}, 3: {"max_queue_size": 9}}}).model_defaults
    notes: list[str] = []
    batching = load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n", "m.yaml"), defaults,
                                 notes).batching
    assert batching.priority_levels == 1 and batching.priority_queue_policy == {
        1: QueuePolicy(max_queue_size=5, default_timeout_ms=None)}
    assert notes == ["model_defaults' batching.priority_queue_policy levels 2, 3 left out: "
                     "the model has 1 priority level"]
    notes.clear()
    assert load_model_config(write(tmp_path, "instances: 2\n", "m.yaml"), defaults, notes).batching == \
        defaults.batching and notes == []
    past_levels = "batching.priority_queue_policy.2: names a level past priority_levels (1)"
    with pytest.raises(ConfigError, match=re.escape(past_levels)):
        load_model_config(write(tmp_path, "batching: {priority_levels: 1, priority_queue_policy: "
                                          "{2: {max_queue_size: 1}}}\n", "m.yaml"), defaults)


def test_queue_limits_take_auto_or_numbers():
    auto = load_server_config().model_defaults.batching.default_queue_policy
    assert auto.max_queue_size is None and auto.default_timeout_ms is None
    config = load_server_config(None, {"model_defaults.batching.default_queue_policy": {
        "max_queue_size": 0, "default_timeout_ms": 0}})
    policy = config.model_defaults.batching.default_queue_policy
    assert policy.max_queue_size == 0 and policy.default_timeout_ms == 0.0


def test_a_models_share_of_request_memory_takes_auto_or_bytes_within_the_limits():
    assert load_server_config().max_inflight_bytes_per_model == 0  # auto: server/budget.model_share
    assert load_server_config(None, {"max_inflight_bytes_per_model": "Auto"}).max_inflight_bytes_per_model == 0
    both = {"max_request_bytes": 1 << 20, "max_inflight_bytes": 8 << 20}
    for share in (1 << 20, 8 << 20):  # from one request's limit to the whole budget
        assert load_server_config(None, {**both, "max_inflight_bytes_per_model": share}).max_inflight_bytes_per_model \
            == share


@pytest.mark.parametrize("text, policy", [
    ("version_policy: all\n", ("all",)),
    ("version_policy: {all: true}\n", ("all",)),
    ("version_policy: {latest: 2}\n", ("latest", 2)),
    ("version_policy: {specific: [3, 1]}\n", ("specific", (1, 3))),
    # named choices in any case, as the README says of every one (ALL and Latest were refused)
    ("version_policy: ALL\n", ("all",)),
    ("version_policy: {All: true}\n", ("all",)),
    ("version_policy: {Latest: 2}\n", ("latest", 2)),
    ("version_policy: {SPECIFIC: [3, 1]}\n", ("specific", (1, 3))),
    # Triton's form, as /v2/models/{m}/config shows it (pasted from there, it was refused)
    ("version_policy: {specific: {versions: [3, 1]}}\n", ("specific", (1, 3))),
    ("version_policy: {latest: {num_versions: 2}}\n", ("latest", 2)),
])
def test_model_file_merges_over_defaults_and_replaces_version_policy(tmp_path, text, policy):
    defaults = load_server_config(None, {"model_defaults.instances": 2}).model_defaults
    config = load_model_config(write(tmp_path, text + "slots: 3\n"), defaults)
    assert config.version_policy == policy
    assert config.slots == 3 and config.instances == 2


def test_slots_auto_is_kept_through_a_merge(tmp_path):
    defaults = load_server_config(None, {}).model_defaults
    assert defaults.slots == 0  # auto: chosen by runtime when the model loads
    assert load_model_config(write(tmp_path, "instances: 2\n"), defaults).slots == 0
    assert load_model_config(write(tmp_path, "slots: 2\n"), defaults).slots == 2
    assert load_server_config(None, {"model_defaults.slots": 3}).model_defaults.slots == 3
    assert load_model_config(write(tmp_path, "slots: 10921\n"), defaults).slots == 10921
    with pytest.raises(ConfigError, match=r"slots: must be <= 10921, got 99999999999999999999"):
        load_model_config(write(tmp_path, "slots: 99999999999999999999\n"), defaults)


@pytest.mark.parametrize("levels, level", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_fewer_priority_levels_alone_take_the_middle_one_as_default(tmp_path, levels, level):
    """A model's `priority_levels: 1` was refused for the embedded default's default_priority 2,
    which it never set; the default is now the middle level of the model's own."""
    defaults = load_server_config(None, {}).model_defaults
    batching = load_model_config(write(tmp_path, f"batching: {{priority_levels: {levels}}}\n"), defaults).batching
    assert batching.default_level == level and batching.level_for(None) == level
    assert load_server_config(None, {"model_defaults.batching.priority_levels": levels}
                              ).model_defaults.batching.default_level == level


def test_priorities_off_is_no_yaml_key(tmp_path):
    """A config.pbtxt's priority_levels 0 is carried as priorities_off (config/triton_config.py, for
    /config); aclserve's own YAML writes one level as `priority_levels: 1` and has no such key."""
    defaults = load_server_config(None, {}).model_defaults
    with pytest.raises(ConfigError, match="priorities_off"):
        load_model_config(write(tmp_path, "batching: {priorities_off: true}\n"), defaults)
    assert not load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n"), defaults).batching.priorities_off


def test_a_default_priority_set_is_kept_through_a_merge(tmp_path):
    defaults = load_server_config(None, {"model_defaults.batching.default_priority": 3}).model_defaults
    assert defaults.batching.default_level == 3
    assert load_model_config(write(tmp_path, "instances: 2\n"), defaults).batching.default_level == 3
    # past a model's own priority_levels it goes back to auto, said in a note (it was refused:
    # "batching.default_priority: must be <= 1", a key the model's file did not hold)
    notes = []
    one = load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n"), defaults, notes)
    assert one.batching.default_level == 1
    assert notes == ["model_defaults' batching.default_priority 3 is auto (its middle level) for it: "
                     "the model has 1 priority level"]
    two = load_model_config(write(tmp_path, "batching: {priority_levels: 2}\n"), defaults)
    assert two.batching.default_priority is None  # auto (its middle level)
    # the file's own: refused
    with pytest.raises(ConfigError, match="batching.default_priority: must be <= priority_levels \\(1\\)"):
        load_model_config(write(tmp_path, "batching: {priority_levels: 1, default_priority: 3}\n"), defaults)


def test_preserve_ordering_alone_takes_one_priority_level(tmp_path):
    """`preserve_ordering: true` alone in a model's file kept the default's three levels: answers
    were held for every earlier arrival, so a priority-1 request sent after 120 of level 3 was
    answered 121st, and /config showed a pair Triton refuses (an independent check). The model
    has one level, said in a note, and what model_defaults gives for the others is left out."""
    defaults = load_server_config(None, {"model_defaults.batching": {
        "priority_levels": 4, "default_priority": 3,
        "priority_queue_policy": {1: {"max_queue_size": 5}, 3: {"max_queue_size": 9}}}}).model_defaults
    notes: list[str] = []
    batching = load_model_config(write(tmp_path, "batching: {preserve_ordering: true}\n", "m.yaml"), defaults,
                                 notes).batching
    assert (batching.priority_levels, batching.preserve_ordering, batching.default_level) == (1, True, 1)
    assert batching.priority_queue_policy == {1: QueuePolicy(max_queue_size=5, default_timeout_ms=None)}
    assert notes == ["batching.preserve_ordering takes one priority level, not model_defaults' priority_levels 4 "
                     "(answers in arrival order let no level pass another); model_defaults' "
                     "batching.priority_queue_policy level 3 left out; model_defaults' batching.default_priority 3 "
                     "is auto (its middle level) for it: the model has 1 priority level"]
    notes.clear()
    assert load_model_config(write(tmp_path, "batching: {preserve_ordering: true, priority_levels: 1}\n", "m.yaml"),
                             ModelConfig(), notes).batching.priority_levels == 1 and notes == []


@pytest.mark.parametrize("server, model, path, said", [
    ({}, "batching: {preserve_ordering: true, priority_levels: 2}", "batching.preserve_ordering",
     "takes one priority level, not 2 (batching.priority_levels): answers in arrival order let no level pass "
     "another (Triton refuses the pair too); set priority_levels: 1, or preserve_ordering: false"),
    # model_defaults' preserve_ordering beside the model's own levels
    ({"model_defaults.batching": {"preserve_ordering": True, "priority_levels": 1}}, "batching: {priority_levels: 3}",
     "batching.preserve_ordering", "takes one priority level, not 3 (batching.priority_levels)"),
    ({}, "batching: {preserve_ordering: true, default_queue_policy: {timeout_action: delay}}",
     "batching.default_queue_policy.timeout_action", "delay does not go with preserve_ordering"),
    ({}, "batching: {preserve_ordering: true, priority_queue_policy: {1: {timeout_action: delay, "
         "default_timeout_ms: 5}}}", "batching.priority_queue_policy.1.timeout_action",
     "(Triton refuses the pair too)"),
])
def test_preserve_ordering_beside_what_triton_refuses_with_it_fails_naming_both(tmp_path, server, model, path, said):
    defaults = load_server_config(None, server).model_defaults
    with pytest.raises(ConfigError) as info:
        load_model_config(write(tmp_path, model + "\n", "m.yaml"), defaults)
    assert info.value.path == path and said in info.value.problem
    # without a deadline, delay never moves a request: Triton takes it, and so does aclserve
    assert load_model_config(write(tmp_path, "batching: {preserve_ordering: true, default_queue_policy: "
                                             "{timeout_action: delay, default_timeout_ms: 0}}\n", "m.yaml"),
                             ModelConfig()).batching.preserve_ordering


def test_model_file_error_names_file_and_key(tmp_path):
    path = write(tmp_path, "batching: {max_batch_size: -1}\n")
    with pytest.raises(ConfigError) as info:
        load_model_config(path, ModelConfig())
    assert str(info.value) == f"{path}: batching.max_batch_size: must be >= 0, got -1"


def test_a_models_bad_compile_option_is_refused_as_its_file_is_read(tmp_path):
    """A model's own compile.precision_mode or input_shape that ATC would refuse is that file's error,
    as its other keys' are (it was found only at the model's compile)."""
    for text, said in (("compile: {precision_mode: bogus}", "compile.precision_mode: 'bogus' is not one ATC takes"),
                       ("compile: {input_shape: 'x:-2'}", "compile.input_shape: malformed entry 'x:-2': dims must be "
                        "positive or -1")):
        path = write(tmp_path, text + "\n", "m.yaml")
        with pytest.raises(ConfigError) as info:
            load_model_config(path, ModelConfig())
        assert str(info.value).startswith(f"{path}: {said}")
    assert load_model_config(write(tmp_path, "compile: {precision_mode: force_fp32, input_shape: 'x:-1,8'}\n",
                                   "m.yaml"), ModelConfig()).compile.precision_mode == "force_fp32"
    # a named choice in any case (README "Configuration"), kept as ATC writes it
    assert load_model_config(write(tmp_path, "compile: {precision_mode: FORCE_FP32}\n", "m.yaml"),
                             ModelConfig()).compile.precision_mode == "force_fp32"


def test_model_config_mapping_round_trips():
    config = parse_model_config(yaml.safe_load(
        "instances: 2\ndevices: [0, 1]\nversion_policy: {specific: [2]}\n"
        "compile: {batch: [1, 4], input_shape: 'x:-1,8'}\n"
        "batching: {priority_queue_policy: {1: {max_queue_size: 5}}}\n"))
    assert parse_model_config(model_config_mapping(config)) == config
    assert parse_model_config(model_config_mapping(ModelConfig())) == ModelConfig()


def test_trace_and_logging_keys():
    from aclserve.config import ConfigError, load_server_config
    config = load_server_config(None, {"trace": {"level": "TIMESTAMPS", "rate": 5, "file": "t.json",
                                                 "format": "triton"}, "log_format": "json", "request_log": True})
    assert (config.trace.level, config.trace.rate, config.trace.file, config.trace.format) == \
        ("TIMESTAMPS", 5, "t.json", "triton")
    assert config.log_format == "json" and config.request_log and config.trace_dir == "traces"
    assert load_server_config().trace.level == "OFF"
    for overrides, message in [({"trace": {"rate": 0}}, "trace.rate: must be between 1"),
                               ({"trace": {"level": False}}, 'trace.level: .*YAML reads a bare OFF as false'),
                               ({"trace": {"colour": 1}}, "trace.colour: unknown key"),
                               ({"log_format": "xml"}, "log_format: must be one of text, json")]:
        with pytest.raises(ConfigError, match=message):
            load_server_config(None, overrides)


@pytest.mark.parametrize("text, said", [
    ("{level: abc}", "trace.level: expected OFF or TIMESTAMPS, got 'abc'"),  # (as written: it said ABC)
    ("{level: [1, 2]}", "trace.level: must be a string, got [1, 2]"),  # (it said "got 1, 2")
    ("{level: 1.5}", "trace.level: must be a string, got 1.5"),  # ("expected a string, got float")
    ("{level: null}", "trace.level: must be a string, got None"),  # ("must be a string or a number")
    ("{level: false}", 'trace.level: must be a string, got False (write "OFF" in quotes: YAML reads a bare OFF as '
                       'false)'),
    ("{format: [chrome]}", "trace.format: must be a string, got ['chrome']"),  # (a list was taken as its item)
    ("{file: [t.json]}", "trace.file: must be a string, got ['t.json']"),
    ("{rate: null}", "trace.rate: must be an integer, got None"),  # ("must be a string or a number")
])
def test_a_trace_setting_of_the_wrong_type_is_said_in_one_wording(tmp_path, text, said):
    """The file's trace keys said a wrong type five ways, as the trace API's values (Triton's
    strings and lists) were judged, and took a list for its item (a tester, t92): each key's type
    is the file's own now, said as every other key says it."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, f"trace: {text}\n"))
    assert str(info.value).endswith(f"c.yaml: {said}"), str(info.value)


def test_an_integer_inputs_value_range_is_two_integers_smallest_first(tmp_path):
    defaults = load_server_config(None, {"model_defaults.inputs": {"n": {"value_range": [0, 5]}}}).model_defaults
    assert defaults.inputs["n"].value_range == (0, 5)
    config = load_model_config(write(tmp_path, "inputs: {n: {value_range: [-3, 3]}}\n", "m.yaml"), defaults)
    assert config.inputs["n"].value_range == (-3, 3)  # the model's own replaces the default's
    for text, problem in [("[1]", "must be [smallest, largest], two integers, got [1]"),
                          ("[0, 2.5]", "inputs.n.value_range[1]: must be an integer, got 2.5"),
                          ("[4, 3]", "smallest 4 is above largest 3"),
                          ("7", "must be [smallest, largest], two integers, got 7")]:
        with pytest.raises(ConfigError, match=re.escape(problem)):
            load_model_config(write(tmp_path, f"inputs: {{n: {{value_range: {text}}}}}\n", "m.yaml"), defaults)
    with pytest.raises(ConfigError, match="set image or value_range, not both"):
        load_model_config(write(tmp_path, "inputs: {n: {value_range: [0, 1], image: {color: gray}}}\n", "m.yaml"),
                          defaults)


def test_a_bad_version_policy_in_tritons_form_names_its_inner_key(tmp_path):
    with pytest.raises(ConfigError, match=r"version_policy\.latest\.num_versions: must be >= 1, got 0"):
        load_model_config(write(tmp_path, "version_policy: {latest: {num_versions: 0}}\n"), ModelConfig())


def test_device_limits_up_to_what_a_device_allows_are_taken():
    assert load_server_config(None, {"device_limits": {"events": 65535}}).device_limits == (None, 65535)
    assert load_server_config(None, {"device_limits": {"streams": 2048}}).device_limits == (2048, None)


def test_a_host_in_brackets_is_refused_at_once_saying_to_drop_them(tmp_path):
    """`host: "[::1]"`, as a URL writes an IPv6 address, was refused only at the bind: "cannot
    listen on [[::1]]:8000: Name or service not known" (a configuration tester's finding)."""
    for host, write_instead in (("[::1]", "::1"), ("[::]:8000", ":: (and the port in port)")):
        said = f"host: an IPv6 address goes without brackets here: write {write_instead}, got '{host}'"
        with pytest.raises(ConfigError) as info:
            load_server_config(write(tmp_path, f'host: "{host}"\n'))
        assert str(info.value).endswith(said), str(info.value)
        with pytest.raises(ConfigError) as info:
            load_server_config(None, {"host": host})
        assert str(info.value) == said, str(info.value)
    assert load_server_config(write(tmp_path, 'host: "::1"\n')).host == "::1"


@pytest.mark.parametrize("text, said", [
    ("host: 2001-12-14", "host: must be a non-empty string, got datetime.date(2001, 12, 14) (YAML reads it as a "
                         "date: write it in quotes for text)"),
    ("trace_dir: 2001-12-14 10:00:00", "trace_dir: must be a non-empty string, got datetime.datetime(2001, 12, 14, "
                                       "10, 0) (YAML reads it as a date: write it in quotes for text)"),
    ("models_dir: 2024", "models_dir: must be a non-empty string, got 2024 (YAML reads it as a number: write it in "
                         "quotes for text)"),
    ("trace: {file: 2001-12-14}", "trace.file: must be a string, got datetime.date(2001, 12, 14) (YAML reads it as "
                                  "a date: write it in quotes for text)"),
    # (taken as the file "16", as 2024, 0, -1 and 0b11 were: traces went to ./16, a tester, t92)
    ("trace: {file: 0x10}", "trace.file: must be a string, got 16 (YAML reads it as a number: write it in quotes for "
                            "text)"),
    ("trace: {file: 0b11}", "trace.file: must be a string, got 3 (YAML reads it as a number: write it in quotes for "
                            "text)"),
    ("model_defaults: {outputs: {y: {labels: 2001-12-14}}}", "model_defaults.outputs.y.labels: must be a non-empty "
     "string, got datetime.date(2001, 12, 14) (YAML reads it as a date: write it in quotes for text)")])
def test_a_date_or_number_yaml_reads_where_text_goes_is_refused_saying_to_quote_it(tmp_path, text, said):
    """`host: 2001-12-14` said only "got datetime.date(2001, 12, 14)" (a configuration tester's finding)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, text + "\n"))
    assert str(info.value).endswith(f"c.yaml: {said}"), str(info.value)
    quoted = re.sub(r": ([0-9][^}]*)(}*)$", r': "\1"\2', text)  # (quoted, each is text and taken)
    load_server_config(write(tmp_path, quoted + "\n"))


def test_a_tensor_named_by_a_number_yaml_reads_is_refused_saying_to_quote_it(tmp_path):
    """A tensor's name is a mapping's key: `0x10:` named the output "16" (str() of YAML's number),
    as trace.file took 0x10 for the file "16" (a tester, t92)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "model_defaults: {outputs: {0x10: {labels: l.txt}}}\n"))
    assert str(info.value).endswith("c.yaml: model_defaults.outputs: the key 16 must be a tensor's name, a string "
                                    "(YAML reads it as a number: write it in quotes for text)"), str(info.value)
    config = load_server_config(write(tmp_path, 'model_defaults: {outputs: {"0x10": {labels: l.txt}}}\n'))
    assert list(config.model_defaults.outputs) == ["0x10"]


def test_a_boolean_yaml_reads_where_text_goes_says_to_quote_it(tmp_path):
    """`host: true` (and `api_token: true`) said only that it must be a string (a tester, t84)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "host: true\n"))
    assert str(info.value).endswith("c.yaml: host: must be a non-empty string, got True (YAML reads it as a "
                                    "boolean: write it in quotes for text)"), str(info.value)


@pytest.mark.parametrize("text, overrides, said", [
    ("log_level: verbose\n", {"log_level": "info"}, "log_level: must be one of debug, info, warning, error, critical, "
                                                      "got 'verbose' (--log-level replaces it"),
    ("models_dir: 2024\n", {"models_dir": "models"},
     "models_dir: must be a non-empty string, got 2024 (YAML reads it as a number: write it in quotes for text) "
     "(--models replaces it"),
    ("model_defaults: {batching: {max_batch_size: -1}}\n", {"model_defaults.batching.max_batch_size": 4},
     "model_defaults.batching.max_batch_size: must be >= 0, got -1 (--max-batch replaces it"),
    ("trace: {rate: '10'}\n", {"trace.rate": 10}, "trace.rate: must be an integer, got '10'"),
    ("model_defaults: {batching: 5}\n", {"model_defaults.batching.max_batch_size": 4},
     "model_defaults.batching: must be a mapping, got 5 (--max-batch replaces it"),  # (the section, not the key)
    ("model_defaults: none\n", {"model_defaults.batching.max_queue_delay_ms": 4},
     "model_defaults: must be a mapping, got 'none' (--max-delay-ms replaces it"),
    ("port: 70000\n", {"port": 0}, "port: must be <= 65535, got 70000 (the command line replaces it"),
])
def test_a_files_value_an_override_replaces_is_checked_as_the_file_alone(tmp_path, text, overrides, said):
    """A file's bad value stopped nothing while a flag replaced it, and stopped the server once the
    flag went (a tester's ConfigMap, found when the Deployment's args changed): the file's error,
    as the file alone gives it, with what replaced the value (`the command line`: no flags known)."""
    from aclserve.cli.serve import SERVE_FLAGS
    path = write(tmp_path, text)
    flags = {} if "port" in overrides else SERVE_FLAGS
    with pytest.raises(ConfigError) as info:
        load_server_settings(path, overrides, flags)
    assert str(info.value).startswith(f"{path}: {said}"), str(info.value)
    assert str(info.value).endswith(" replaces it, but the file must hold on its own)")


def test_a_combination_only_the_overrides_make_whole_is_not_the_files_to_answer(tmp_path):
    """The file's values are each checked; settings that do not go together are the result's: a
    file giving port and grpc_port the same, which `--grpc-port 0` turns off, is refused for its
    bad log_level, which `--log-level` replaces, not for the pair; without that, it loads."""
    path = write(tmp_path, "port: 9000\ngrpc_port: 9000\nlog_level: verbose\n")
    with pytest.raises(ConfigError) as info:
        load_server_settings(path, {"grpc_port": 0, "log_level": "info"})
    assert str(info.value).startswith(f"{path}: log_level: must be one of"), str(info.value)
    path = write(tmp_path, "port: 9000\ngrpc_port: 9000\n")
    assert load_server_settings(path, {"grpc_port": 0})[0].grpc_port == 0
