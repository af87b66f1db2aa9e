"""`aclserve serve` stopped at its start says why in one line (a JSON line under --log-format json):
a bad flag as the command line's, an address or port it cannot listen on, a bad runtime setting in
the environment."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket

import pytest

from tests import REPO
from tests.aclserve_command import run_aclserve


def test_serve_names_the_command_line_for_a_bad_flag_not_the_config_file(tmp_path):
    """`serve --config c.yaml --cpu-threads 0` said "bad configuration: .../c.yaml: cpu_threads: ..."."""
    (tmp_path / "c.yaml").write_text("port: 0\ngrpc_port: 0\n")
    proc = run_aclserve("serve", "--config", "c.yaml", "--cpu-threads", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "c.yaml" not in proc.stderr, proc.stderr
    assert "error: bad configuration: command line: cpu_threads: must be >= 1, got 0" in proc.stderr, proc.stderr


def test_serve_names_the_command_line_for_a_bad_flag_without_a_config_file(tmp_path):
    """`serve --port -1` said "bad configuration: port: must be >= 0, got -1", naming no source."""
    proc = run_aclserve("serve", "--port", "-1", "--grpc-port", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "error: bad configuration: command line: port: must be >= 0, got -1" in proc.stderr, proc.stderr


# (a name that resolves nowhere: "Temporary failure in name resolution" where no DNS server can be
# reached, as in the test run's own network namespace, tests/private_network.py)
@pytest.mark.parametrize("host, whys", [("no.such.host.invalid", ("Name or service not known",
                                                                  "Temporary failure in name resolution")),
                                        ("10.255.255.1", ("Cannot assign requested address",))])
def test_serve_on_a_host_it_cannot_bind_says_so_in_one_error(tmp_path, host, whys):
    """Before, the token warning ("listening on H without an API token") came first, and the
    models' loads began before the bind (a load abandoned: "digits: version 1 was still loading");
    then the runtime's start ("ACL runtime: cpu ...") still did."""
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models")
    proc = run_aclserve("serve", "--host", host, "--port", "0", "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() in ([f"aclserve serve: error: cannot listen on {host}:0: {why}"] for why in whys), \
        proc.stderr


@contextlib.contextmanager
def _busy_port(tmp_path):
    """A port something else listens on (yielded), and an empty models folder in `tmp_path` (a
    missing one is refused before anything listens)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        (tmp_path / "models").mkdir()
        yield busy.getsockname()[1]


def test_serve_on_a_busy_http_port_says_so_in_one_error(tmp_path):
    with _busy_port(tmp_path) as port:
        proc = run_aclserve("serve", "--port", str(port), "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
        as_json = run_aclserve("serve", "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--log-format",
                               "json", cwd=tmp_path)
    said = f"cannot listen on 127.0.0.1:{port}: Address already in use (--port PORT moves it)"
    # its one line: not the runtime's start before it, nor a shutdown's lines after it
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"aclserve serve: error: {said}"], proc.stderr
    # with JSON logs the line saying why it stopped is a JSON line too (a log shipper reads only those)
    assert as_json.returncode == 2 and len(as_json.stderr.splitlines()) == 1, as_json.stderr
    last = json.loads(as_json.stderr.splitlines()[-1])
    assert last["level"] == "critical" and last["message"] == f"aclserve serve: error: {said}", as_json.stderr


def test_serve_on_a_busy_grpc_port_says_so_in_one_error(tmp_path):
    with _busy_port(tmp_path) as port:
        proc = run_aclserve("serve", "--port", "0", "--grpc-port", str(port), "--device", "cpu", cwd=tmp_path)
    # its one line: not grpc core's own (add_port.cc), nor the runtime's start or HTTP's "listening" before it,
    # nor a shutdown's lines after it (an operator looking for those found false ones)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"aclserve serve: error: gRPC cannot listen on 127.0.0.1:{port}: Address already in use (--grpc-port PORT "
        "moves it, --grpc-port 0 turns gRPC off)"], proc.stderr


@pytest.mark.parametrize("args, config, env, said", [
    (("--log-format", "json"), None, {"ACLSERVE_DEVICE": "gpu"},
     "ACLSERVE_DEVICE must be one of auto, npu, cpu, not 'gpu'"),
    (("--config", "c.yaml"), "log_format: JSON\nreadiness: sometimes\n", {},
     "bad configuration: c.yaml: readiness: must be one of strict, lenient"),
    (("--log-format", "json", "--config", "c.yaml"), "readiness: sometimes\n", {},
     "bad configuration: c.yaml: readiness: must be one of strict, lenient"),
    (("--log-format", "json", "--trace", "models"), None, {}, "cannot write the trace file models: it is a folder"),
])
def test_serve_stopped_before_logging_is_set_up_says_why_in_json_when_asked(tmp_path, args, config, env, said):
    """`--log-format json` (or the file's log_format) left the errors found before logging was set
    up, in the environment, the config or the trace file, plain text lines (a tester, t84)."""
    (tmp_path / "models").mkdir()
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", *args, cwd=tmp_path,
                        env={**os.environ, **env})
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    line = json.loads(proc.stderr)
    assert line["level"] == "critical" and line["message"].startswith(f"aclserve serve: error: {said}"), proc.stderr


@pytest.mark.parametrize("env, said", [
    ({"ACLSERVE_CPU_DEVICES": "abc"}, "ACLSERVE_CPU_DEVICES must be an integer from 1 to 64, got 'abc'"),
    # (a helper's fuzz: the start built one device after another until the memory ran out)
    ({"ACLSERVE_CPU_DEVICES": "99999999999999999999"}, "ACLSERVE_CPU_DEVICES must be an integer from 1 to 64"),
    ({"ACLSERVE_CPU_DEVICE_MEMORY": "lots"}, "ACLSERVE_CPU_DEVICE_MEMORY is not a size"),
    ({"ACLSERVE_CPU_MAX_EVENTS": "-3"}, "ACLSERVE_CPU_MAX_EVENTS must be an integer from 1 to"),
    ({"ACLSERVE_CPU_SOC": "ascend310"}, "ACLSERVE_CPU_SOC must be CPU-ORT or a SoC name"),
    ({"ACLSERVE_DEVICE": "gpu"}, "ACLSERVE_DEVICE must be one of auto, npu, cpu"),
    ({"ACLSERVE_DEVICE": "npu"}, "CANN's `acl` module is not importable"),  # no machine here has CANN
])
def test_serve_with_a_bad_runtime_setting_in_the_environment_says_so_in_one_line(tmp_path, env, said):
    """Found by an independent check: each was a traceback from inside acl.init (ACLSERVE_DEVICE,
    with the config's device at its default auto, was not read at all)."""
    (tmp_path / "models").mkdir()
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", cwd=tmp_path,
                        env={**os.environ, **env})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert said in proc.stderr, proc.stderr
