"""Config errors name their dotted path and the file the value came from; an unknown key, and YAML
that cannot be read (invalid, an alias bomb, nested too deeply, a key given twice), in one short
line."""
from __future__ import annotations

import pytest

from aclserve.config import ConfigError, ModelConfig, load_model_config, load_server_config
from tests.config_files import write


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


def test_file_errors_name_the_file(tmp_path):
    path = write(tmp_path, "model_defaults:\n  batching:\n    max_queue_delay_ms: -1\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value) == f"{path}: model_defaults.batching.max_queue_delay_ms: must be >= 0, got -1"


def test_model_file_error_names_file_and_key(tmp_path):
    path = write(tmp_path, "batching: {max_batch_size: -1}\n")
    with pytest.raises(ConfigError) as info:
        load_model_config(path, ModelConfig())
    assert str(info.value) == f"{path}: batching.max_batch_size: must be >= 0, got -1"


def test_a_bad_version_policy_in_tritons_form_names_its_inner_key(tmp_path):
    with pytest.raises(ConfigError, match=r"version_policy\.latest\.num_versions: must be >= 1, got 0"):
        load_model_config(write(tmp_path, "version_policy: {latest: {num_versions: 0}}\n"), ModelConfig())


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
