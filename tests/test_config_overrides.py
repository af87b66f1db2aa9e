"""Overrides (the command line's) over a config file: a bad override is the command line's, not the
file's; a value an override replaces is still checked as the file alone gives it, and a combination
only the overrides make whole is not the file's to answer. (Settings that do not go together name
where each value came from: test_config_origins.py.)"""
from __future__ import annotations

import re

import pytest

from aclserve.config import ConfigError, load_server_settings, load_server_config
from tests.config_files import write


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
