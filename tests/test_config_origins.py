"""Settings that do not go together: the refusal names where each value came from (a flag, the
config file, an environment variable, the default). `aclserve serve --config f.yaml --port 9000`
with `grpc_port: 9000` in f.yaml said "f.yaml: grpc_port: must differ from port (9000)", blaming
the file for a value the flag had set."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import aiohttp
import pytest
import trustme

from aclserve.cli import build_parser
from aclserve.cli.serve import SERVE_FLAGS, serve_flags, serve_overrides
from aclserve.config import ConfigConflict, load_server_config, load_server_settings
from tests import REPO
from tests.serving import free_port, started_app


def _aclserve(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "aclserve", "serve", "--device", "cpu", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def _refusal(proc) -> str:
    """The one line `aclserve serve` says about its configuration, and the exit status 2."""
    lines = [line for line in proc.stderr.splitlines() if "bad configuration" in line]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "ACL runtime" not in proc.stderr  # refused before anything started
    return lines[0]


def test_a_flag_and_the_file_giving_one_port_are_each_named(tmp_path):
    (tmp_path / "models").mkdir()
    port = free_port()
    (tmp_path / "grpc.yaml").write_text(f"grpc_port: {port}\n")
    (tmp_path / "http.yaml").write_text(f"port: {port}\n")
    said = _refusal(_aclserve("--config", "grpc.yaml", "--port", str(port), cwd=tmp_path))
    assert said.endswith(f"error: bad configuration: grpc_port: must differ from port ({port}); 0 turns gRPC off "
                         "(port from --port, grpc_port from grpc.yaml)"), said
    said = _refusal(_aclserve("--config", "http.yaml", "--grpc-port", str(port), cwd=tmp_path))
    assert said.endswith("(port from http.yaml, grpc_port from --grpc-port)"), said
    # no file: the flag and the embedded default's 8001 (refused before anything binds)
    said = _refusal(_aclserve("--port", "8001", cwd=tmp_path))
    assert said.endswith("error: bad configuration: grpc_port: must differ from port (8001); 0 turns gRPC off "
                         "(port from --port, grpc_port from the default)"), said


@pytest.mark.parametrize("text, flags, said", [
    ("tls_cert_file: c.pem\n", {}, "tls_key_file: TLS needs both tls_cert_file and tls_key_file "
                                   "(tls_cert_file from {file}, tls_key_file from the default)"),
    ("tls_key_file: k.pem\n", {},
     "tls_cert_file: TLS needs both tls_cert_file and tls_key_file (tls_cert_file from the default, "
     "tls_key_file from {file})"),
    ("port: 0\n", {"tls_client_ca_file": "ca.pem"}, "tls_client_ca_file: client certificates need TLS: set "
     "tls_cert_file and tls_key_file (tls_client_ca_file from --tls-client-ca, tls_cert_file from the default)"),
    ("max_inflight_bytes: 1000000\n", {}, "max_request_bytes: must be <= max_inflight_bytes (1000000): raise that "
     "too, got 268435456 (max_request_bytes from the default, max_inflight_bytes from {file})"),
    ("max_request_bytes: 400000000\nmax_inflight_bytes_per_model: 300000000\n", {},
     "max_inflight_bytes_per_model: must be >= max_request_bytes (400000000): a request that fits that must fit its "
     "model's share; lower that too, or write auto, got 300000000 (max_inflight_bytes_per_model from {file}, "
     "max_request_bytes from {file})"),
    ("max_body_bytes: 1000000\ngrpc_max_message_bytes: 2000000\n", {},
     "grpc_max_message_bytes: must be <= max_body_bytes (1000000): raise that too or lower this, got 2000000 "
     "(grpc_max_message_bytes from {file}, max_body_bytes from {file})"),
    ("grpc_max_message_bytes: 200000000\nmax_body_bytes: 200000000\n", {},
     "got 200000000 (grpc_max_message_bytes from {file}, max_inflight_bytes from the default)"),
    # the default's own value, written in the file (as a copy of default.yaml has it): set, not lowered unsaid
    ("max_inflight_bytes: 16777216\nmax_request_bytes: 8388608\ngrpc_max_message_bytes: 8388608\n", {},
     "must be <= max_inflight_bytes / 4 (4194304): 4 gRPC messages may be arriving at once (two streams, two calls): "
     "raise max_inflight_bytes too or lower this, got 8388608 (grpc_max_message_bytes from {file}, "
     "max_inflight_bytes from {file})"),
    ("load_retry_initial_s: 100\n", {}, "load_retry_max_s: must be >= load_retry_initial_s (100), got 60 "
     "(load_retry_initial_s from {file}, load_retry_max_s from the default)"),
    ("model_defaults:\n  batching:\n    preserve_ordering: true\n", {"model_defaults.batching.max_batch_size": 4},
     "(model_defaults.batching.preserve_ordering from {file}, model_defaults.batching.priority_levels from the "
     "default)"),
    ("model_defaults:\n  batching: {preserve_ordering: true, priority_levels: 1, priority_queue_policy: "
     "{1: {default_timeout_ms: 5}},\n    default_queue_policy: {timeout_action: delay, default_timeout_ms: 0}}\n", {},
     "model_defaults.batching.priority_queue_policy.1.timeout_action: delay does not go with preserve_ordering: "
     "a request moved back at its deadline would hold every later answer (Triton refuses the pair too); set "
     "reject, or preserve_ordering: false (model_defaults.batching.preserve_ordering from {file}, "
     "model_defaults.batching.default_queue_policy.timeout_action from {file}, "
     "model_defaults.batching.priority_queue_policy.1.default_timeout_ms from {file})"),
    # (it said "f.yaml: model_defaults.batching.default_priority: must be <= 3": the 3 was the default's)
    ("model_defaults:\n  batching: {default_priority: 5}\n", {},
     "model_defaults.batching.default_priority: must be <= priority_levels (3): raise that too, or lower this (auto: "
     "the middle level), got 5 (model_defaults.batching.default_priority from {file}, "
     "model_defaults.batching.priority_levels from the default)"),
    ("model_defaults:\n  batching: {priority_levels: 2}\n", {"model_defaults.batching.default_priority": 3},
     "got 3 (model_defaults.batching.default_priority from the command line, model_defaults.batching.priority_levels "
     "from {file})"),
    # (it said "...priority_queue_policy.5: must be <= 3": the 3 was the default's)
    ("model_defaults:\n  batching: {priority_queue_policy: {5: {max_queue_size: 1}}}\n", {},
     "model_defaults.batching.priority_queue_policy.5: names a level past priority_levels (3): raise that too, or "
     "drop this level, got 5 (model_defaults.batching.priority_queue_policy.5 from {file}, "
     "model_defaults.batching.priority_levels from the default)"),
], ids=["tls key", "tls cert", "client ca", "request bytes", "model share and request",
        "grpc message and body", "grpc message and budget", "grpc message at its default's value",
        "load retry", "ordering and levels", "ordering and delay", "default priority and levels",
        "default priority and the file's levels", "a level's policy and levels"])
def test_every_check_of_two_settings_names_where_each_came_from(tmp_path, text, flags, said):
    """The same words for each check of settings that must go together (a pair, an order): the
    file, a flag or the default, whichever set each."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigConflict) as info:
        load_server_settings(path, flags, SERVE_FLAGS)
    assert str(info.value).endswith(said.format(file=path)), str(info.value)
    assert not str(info.value).startswith(str(path))  # (not the file's alone)


def test_without_the_flags_an_override_is_the_command_lines():
    """The Python API's overrides (no flag names them), as a bad value of one is blamed."""
    with pytest.raises(ConfigConflict) as info:
        load_server_config(None, {"port": 9000, "grpc_port": 9000})
    assert str(info.value) == ("grpc_port: must differ from port (9000); 0 turns gRPC off (port from the command "
                               "line, grpc_port from the command line)")


@pytest.mark.parametrize("given, origin", [("--no-request-log", "--no-request-log"),
                                           ("--request-log", "--request-log")])
def test_a_switch_turned_off_is_named_by_its_negative_flag(tmp_path, given, origin):
    """`serve --no-request-log` was recorded as `--request-log`, the flag that turns it on (a
    reviewer's find): an origin names the flag as it was typed."""
    path = tmp_path / "c.yaml"
    path.write_text("request_log: true\n")
    args = build_parser().parse_args(["serve", "--config", str(path), given])
    config, origins = load_server_settings(path, serve_overrides(args), serve_flags(args))
    assert config.request_log is (given == "--request-log") and origins.of("request_log") == origin
    assert origins.of("port") == "the default" and serve_flags(args)["port"] == "--port"


def test_a_section_given_whole_names_the_default_for_what_it_leaves_out():
    with pytest.raises(ConfigConflict) as info:
        load_server_config(None, {"model_defaults.batching": {"preserve_ordering": True, "priority_levels": 1,
                                                              "default_queue_policy": {"timeout_action": "delay"}}})
    assert str(info.value).endswith("default_queue_policy.timeout_action from the command line, "
                                    "model_defaults.batching.default_queue_policy.default_timeout_ms from the default)")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A certificate and the key of another (a mismatched TLS pair)."""
    folder = tmp_path_factory.mktemp("pair")
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(folder / "other.pem"))
    return folder / "cert.pem", folder / "other.pem"


def test_conflicts_found_as_the_server_starts_name_each_origin(tmp_path, pair):
    """The TLS pair, the API token with gRPC and auth_inference without a token are checked as the
    server starts (after the loader): named the same way."""
    (tmp_path / "models").mkdir()
    cert, key = pair
    (tmp_path / "key.yaml").write_text(f"port: 0\ngrpc_port: 0\ntls_key_file: {key}\n")
    said = _refusal(_aclserve("--config", "key.yaml", "--tls-cert", str(cert), cwd=tmp_path))
    assert said.endswith(f"error: bad configuration: tls_key_file: {key} is not the key of the certificate {cert} "
                         "(tls_cert_file from --tls-cert, tls_key_file from key.yaml)"), said
    (tmp_path / "token.yaml").write_text("port: 0\napi_token: " + "s3cret" * 1000 + "\n")
    said = _refusal(_aclserve("--config", "token.yaml", "--grpc-port", str(free_port()), cwd=tmp_path))
    assert "s3cret" not in said and said.endswith(
        "error: bad configuration: api_token: must be at most 4096 characters for gRPC clients to "
        "send it (metadata), or turn gRPC off (grpc_port: 0) (api_token from token.yaml, grpc_port from --grpc-port)")
    env = dict(os.environ, ACLSERVE_API_TOKEN="s3cret" * 1000)
    said = _refusal(_aclserve("--port", "0", cwd=tmp_path, env=env))
    assert said.endswith("(api_token from ACLSERVE_API_TOKEN, grpc_port from the default)"), said
    (tmp_path / "auth.yaml").write_text("port: 0\ngrpc_port: 0\nauth_inference: true\n")
    env = {k: v for k, v in os.environ.items() if k != "ACLSERVE_API_TOKEN"}
    said = _refusal(_aclserve("--config", "auth.yaml", cwd=tmp_path, env=env))
    assert said.endswith("error: bad configuration: auth_inference: needs a token: set api_token or "
                         "ACLSERVE_API_TOKEN (auth_inference from auth.yaml, api_token from the default)"), said


@pytest.mark.asyncio
async def test_a_models_file_over_model_defaults_names_each_source(tmp_path):
    """A model's file layered over the server config's model_defaults: a conflict names the model's
    file for the keys it gives and model_defaults (its file) or the default for the others. The
    model's load failed with "m.yaml: batching.default_queue_policy.timeout_action: delay does not
    go with preserve_ordering", blaming m.yaml for a key it does not hold."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("m", "own"):
        shutil.copy(REPO / "models" / "digits.om", models / f"{name}.om")
    (models / "m.yaml").write_text("batching: {preserve_ordering: true}\n")
    (models / "own.yaml").write_text("batching: {preserve_ordering: true, default_queue_policy: {timeout_action: "
                                     "delay}}\n")
    (tmp_path / "s.yaml").write_text("model_defaults: {batching: {default_queue_policy: {timeout_action: delay, "
                                     "default_timeout_ms: 100}}}\n")
    config = load_server_config(tmp_path / "s.yaml", {"models_dir": str(models), "port": 0, "grpc_port": 0,
                                                      "device": "cpu", "model_control_mode": "none",
                                                      "log_level": "warning"})
    runner, _, base, _, _ = await started_app(config)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {r["name"]: r for r in await resp.json()}
    finally:
        await runner.cleanup()
    defaults = "the server config's model_defaults (s.yaml)"  # (its path as a client is shown it)
    assert index["m"]["reason"] == (
        "batching.default_queue_policy.timeout_action: delay does not go with preserve_ordering: a request moved "
        "back at its deadline would hold every later answer (Triton refuses the pair too); set reject, or "
        "preserve_ordering: false (batching.preserve_ordering from <models>/m.yaml, "
        f"batching.default_queue_policy.timeout_action from {defaults}, "
        f"batching.default_queue_policy.default_timeout_ms from {defaults})"), index["m"]
    assert index["own"]["reason"].endswith(
        "(batching.preserve_ordering from <models>/own.yaml, batching.default_queue_policy.timeout_action from "
        f"<models>/own.yaml, batching.default_queue_policy.default_timeout_ms from {defaults})"), index["own"]


def test_a_models_file_names_the_embedded_default_and_flags_for_the_rest(tmp_path):
    """Without a server config, what the model's file does not give is the default's (or the flag's)."""
    from aclserve.config import load_model_config
    path = tmp_path / "m.yaml"
    path.write_text("batching: {preserve_ordering: true, default_queue_policy: {timeout_action: delay}}\n")
    config, _ = load_server_settings(None)
    with pytest.raises(ConfigConflict) as info:
        load_model_config(path, config.model_defaults)
    assert str(info.value).endswith(f"(batching.preserve_ordering from {path}, batching.default_queue_policy."
                                    f"timeout_action from {path}, batching.default_queue_policy.default_timeout_ms "
                                    "from the default)"), info.value
    path.write_text("batching: {preserve_ordering: true}\n")
    config, _ = load_server_settings(None, {"model_defaults.batching.default_queue_policy.timeout_action": "delay"},
                                     {"model_defaults.batching.default_queue_policy.timeout_action": "--delay"})
    with pytest.raises(ConfigConflict) as info:
        load_model_config(path, config.model_defaults)
    assert str(info.value).endswith(f"(batching.preserve_ordering from {path}, batching.default_queue_policy."
                                    "timeout_action from --delay, batching.default_queue_policy.default_timeout_ms "
                                    "from the default)"), info.value


def test_a_models_default_priority_past_model_defaults_levels_names_each_source(tmp_path):
    """A model's default_priority past the priority_levels model_defaults gives: it said
    "m.yaml: batching.default_priority: must be <= 2", blaming the model's file for the bound."""
    from aclserve.config import load_model_config
    server, path = tmp_path / "s.yaml", tmp_path / "m.yaml"
    server.write_text("model_defaults: {batching: {priority_levels: 2}}\n")
    path.write_text("batching: {default_priority: 3}\n")
    config, _ = load_server_settings(server)
    with pytest.raises(ConfigConflict) as info:
        load_model_config(path, config.model_defaults)
    assert str(info.value) == (
        "batching.default_priority: must be <= priority_levels (2): raise that too, or lower this (auto: the middle "
        f"level), got 3 (batching.default_priority from {path}, batching.priority_levels from the server config's "
        f"model_defaults ({server}))"), info.value


MODELS_DIR_2024 = ("models_dir: must be a non-empty string, got 2024 (YAML reads it as a number: write it in quotes "
                   "for text)")


def test_the_files_bad_value_a_flag_replaces_stops_the_server(tmp_path):
    """The tester's file, refused alone, started under flags replacing each of its bad values."""
    (tmp_path / "f.yaml").write_text("port: 70000\nlog_level: verbose\nmodels_dir: 2024\n")
    alone = _refusal(_aclserve("--config", "f.yaml", cwd=tmp_path))
    assert alone.endswith(f"error: bad configuration: f.yaml: {MODELS_DIR_2024}"), alone
    said = _refusal(_aclserve("--config", "f.yaml", "--port", "0", "--grpc-port", "0", "--log-level", "info",
                              "--models", "none", cwd=tmp_path))  # (none: a start taking the file ends there)
    assert said.endswith(f"error: bad configuration: f.yaml: {MODELS_DIR_2024} (--models replaces it, but the file "
                         "must hold on its own)"), said
    (tmp_path / "f.yaml").write_text("port: 70000\nlog_level: verbose\n")
    said = _refusal(_aclserve("--config", "f.yaml", "--port", "0", "--grpc-port", "0", "--log-level", "info",
                              "--models", "none", cwd=tmp_path))
    assert said.endswith("error: bad configuration: f.yaml: port: must be <= 65535, got 70000 (--port replaces it, "
                         "but the file must hold on its own)"), said


@pytest.mark.parametrize("text, flags, replacing", [
    ("model_defaults:\n  - instances: 0\n", ("--max-batch", "4"), "--max-batch replaces"),  # (a stray "- ")
    ("model_defaults: {batching: [max_batch_size: 4]}\n", ("--max-delay-ms", "5"), "--max-delay-ms replaces"),
    ('trace: "OFF"\n', ("--trace-rate", "5", "--trace-format", "chrome"), "--trace-rate and --trace-format replace"),
    ("trace: [1, 2]\n", ("--trace", "t.json"), "--trace replaces"),
])
def test_a_files_section_that_is_no_mapping_stops_the_server_whatever_the_flags(tmp_path, text, flags, replacing):
    """A section of the file that is no mapping (a list, text) was dropped unchecked when a flag set a
    key in it, and the server started; without the flag it was refused: the same line now, saying what
    replaced it. A section left empty (null) keeps what is below it, and the flags start."""
    (tmp_path / "f.yaml").write_text(text)
    alone = _refusal(_aclserve("--config", "f.yaml", "--models", "none", cwd=tmp_path))
    assert "f.yaml: " in alone and ": must be a mapping, got " in alone, alone
    said = _refusal(_aclserve("--config", "f.yaml", *flags, "--models", "none", cwd=tmp_path))
    assert said == f"{alone} ({replacing} it, but the file must hold on its own)", said
    (tmp_path / "f.yaml").write_text("model_defaults:\ntrace:\n")
    proc = _aclserve("--config", "f.yaml", *flags, "--models", "none", cwd=tmp_path)
    assert proc.returncode == 2 and "bad configuration" not in proc.stderr, proc.stderr
    assert "models folder none does not exist" in proc.stderr, proc.stderr


def test_the_start_says_the_config_file_and_what_replaced_its_settings(tmp_path):
    """The start-up log never named the config file read, nor which of its settings a flag or an
    environment variable replaced: one INFO line says both, never the token. (The start is
    stopped once it has said them, by a models folder that does not exist.)"""
    (tmp_path / "f.yaml").write_text('port: 9000\ngrpc_port: 0\napi_token: "f1le-t0ken"\nlog_level: warning\n')
    env = dict(os.environ, ACLSERVE_API_TOKEN="env-t0ken")
    proc = _aclserve("--config", "f.yaml", "--port", "0", "--log-level", "info", "--models", "none", cwd=tmp_path,
                     env=env)
    assert proc.returncode == 2 and "models folder none does not exist" in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "config file" in line]
    assert len(lines) == 1 and lines[0].endswith(
        " INFO aclserve.cli.serve: config file f.yaml read, its settings replaced: port from --port; "
        "log_level from --log-level; api_token from ACLSERVE_API_TOKEN"), proc.stderr
    assert "t0ken" not in proc.stderr
    (tmp_path / "g.yaml").write_text("grpc_port: 0\n")
    proc = _aclserve("--config", "g.yaml", "--port", "0", "--models", "none", cwd=tmp_path)
    assert proc.stderr.count(" INFO aclserve.cli.serve: config file g.yaml read\n") == 1, proc.stderr


@pytest.mark.parametrize("asker", ["--device", "file", "environment"])
def test_npu_asked_for_without_cann_names_what_asked(tmp_path, asker):
    """It said "device npu asked for (device, --device or ACLSERVE_DEVICE)", leaving the operator
    to find which of the three it was (a tester)."""
    import importlib.util
    if importlib.util.find_spec("acl") is not None:
        pytest.skip("CANN's acl module is here: npu may be served")
    (tmp_path / "models").mkdir()
    (tmp_path / "n.yaml").write_text("device: npu\n")
    args = {"--device": ["--device", "npu"], "file": ["--config", "n.yaml"], "environment": []}[asker]
    env = dict(os.environ, ACLSERVE_DEVICE="npu")
    proc = subprocess.run([sys.executable, "-m", "aclserve", "serve", "--port", "0", "--grpc-port", "0", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    by = {"--device": "--device", "file": "device in n.yaml",
          "environment": "ACLSERVE_DEVICE=npu (the device setting being auto)"}[asker]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: device npu asked for by {by} but CANN's `acl` module is not importable or sees no device" \
        in proc.stderr, proc.stderr
