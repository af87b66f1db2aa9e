"""Config loading: the embedded defaults, a file merged over them and overrides over both, a model's
file over model_defaults, auto values, named choices in any case."""
from __future__ import annotations

import pytest
import yaml

from aclserve.config import (DEFAULT_CONFIG_PATH, ConfigError, ModelConfig, load_model_config, load_server_config,
                             model_config_mapping, parse_model_config)
from tests import REPO
from tests.config_files import write


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


def test_device_limits_up_to_what_a_device_allows_are_taken():
    assert load_server_config(None, {"device_limits": {"events": 65535}}).device_limits == (None, 65535)
    assert load_server_config(None, {"device_limits": {"streams": 2048}}).device_limits == (2048, None)
