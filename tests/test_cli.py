"""What a new user meets at the command line: help that describes the tool, no tracebacks."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from aclserve.cli.infer_metadata import cast_to_model
from aclserve.cli.remote import check_url
from aclserve.cli.usage import UsageError

from tests import REPO


def _aclserve(*args, cwd=REPO, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_top_level_help_describes_the_tool():
    out = _aclserve("--help").stdout
    assert "KServe v2" in out and "aclserve serve" in out and "argparse" not in out


def test_serve_help_says_what_debug_logs():
    """"debug also logs every request" was not so: only aiohttp's access log is added, which no
    gRPC call reaches (an SRE's audit); the request log is the one for every infer request."""
    out = " ".join(_aclserve("serve", "--help").stdout.split())
    assert "every request" not in out
    assert "debug adds aiohttp's access log" in out and "gRPC calls are not in it" in out and "--request-log" in out


def test_ctrl_c_while_the_commands_import_ends_quietly(monkeypatch):
    """A Ctrl-C in the first ~0.1 s (build_parser imports numpy) was a KeyboardInterrupt traceback."""
    import aclserve.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        status = cli.main(["serve"])
    except KeyboardInterrupt:
        status = "KeyboardInterrupt escaped main()"
    assert status == 130


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.run(f"{sys.executable} -m aclserve inspect models/digits.om | head -1", shell=True,
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("models/digits.om") and "Traceback" not in proc.stderr


def test_serve_without_a_models_folder_says_how_to_point_at_one(tmp_path):
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr and "--models" in proc.stderr
    assert "listening" not in proc.stderr, proc.stderr  # (it said so first, then exited)


def test_compile_takes_its_target_in_any_case(tmp_path):
    """--target CPU was "unknown target 'CPU'"."""
    proc = _aclserve("compile", str(REPO / "models" / "digits.onnx"), "-o", str(tmp_path / "d.om"), "--target", "CPU")
    assert proc.returncode == 0 and (tmp_path / "d.om").exists(), proc.stderr


def test_serve_takes_its_named_choices_in_any_case(tmp_path):
    """--log-level INFO was "invalid choice" while log_level: INFO in a file was taken."""
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "CPU", "--log-level", "INFO",
                     "--readiness", "Lenient", "--model-control-mode", "None", "--log-format", "JSON",
                     "--trace-format", "Triton", cwd=tmp_path)
    assert "invalid choice" not in proc.stderr and "does not exist" in proc.stderr, proc.stderr  # (no models/)


# (each said "must be at most 8000 printable characters without blanks at its ends", not which rule it
# broke: a tester, t92)
@pytest.mark.parametrize("where, token, grpc, said", [
    ("config", "s3\tcret", False, "must hold printable characters only, not a control character such as a newline or "
                                  "a tab: no client could send it"),
    ("environment", " s3cret", False, "must not begin or end with a blank, such as a space, a tab or a newline: no "
                                      "client could send it"),
    ("config", "s3cret" * 1500, False, "must be at most 8000 characters, as an HTTP header line holds no more (it has "
                                       "9,000): no client could send it"),  # past aiohttp's 8 KB header line
    ("config", "s3cret" * 1000, True, "for gRPC clients to send it"),
    ("config", "t\u00f6k-s3cret", False, "must be ASCII: HTTP clients send other characters in different encodings"),
    # (a Secret made from a file keeps its last newline: the usual cause, which the refusal now names)
    ("environment", "s3cret\n", False, "must not begin or end with a blank, such as a space, a tab or a newline (it "
                                       "ends in a newline, as a Secret made with `kubectl create secret generic "
                                       "--from-file` from a file"),
], ids=["control character", "blank at its start", "9 KB", "5 KB with gRPC", "not ASCII", "a newline at its end"])
def test_serve_refuses_an_api_token_no_client_could_send(tmp_path, where, token, grpc, said):
    """Such a token answered 401 (or a 400 that quoted it back) to every request it guarded. Over
    HTTP alone a 5 KB token works and is kept (gRPC off); a non-ASCII one is refused there too, as
    Python's clients send it in Latin-1 and curl in UTF-8 (a tester). The refusal names the file
    it came from, as the config loader's do (it named the key alone)."""
    (tmp_path / "c.yaml").write_text(f"api_token: {json.dumps(token)}\n")
    (tmp_path / "models").mkdir()  # (a missing one is refused first)
    args = ["--config", "c.yaml"] if where == "config" else []
    env = dict(os.environ, ACLSERVE_API_TOKEN=token) if where == "environment" else None
    grpc_port = "8001" if grpc else "0"  # (refused before anything binds)
    proc = _aclserve("serve", "--port", "0", "--grpc-port", grpc_port, "--device", "cpu", *args, cwd=tmp_path, env=env)
    name = "c.yaml: api_token" if where == "config" else "ACLSERVE_API_TOKEN"
    if grpc:  # the token's and grpc_port's: where each came from (test_config_origins.py)
        name, said = "api_token", f"{said} (metadata), or turn gRPC off (grpc_port: 0) (api_token from c.yaml, " \
                                  "grpc_port from --grpc-port)"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "s3cret" not in proc.stderr
    assert f"error: bad configuration: {name}: must" in proc.stderr and said in proc.stderr, proc.stderr


@pytest.mark.parametrize("where, token", [("config", "${ACLSERVE_TOKEN}"), ("config", "$TOKEN"),
                                          ("environment", "$(API_TOKEN)"), ("environment", "${TOKEN}"),
                                          ("replaced", "${ACLSERVE_TOKEN}")])
def test_serve_refuses_a_token_that_is_a_placeholder(tmp_path, where, token):
    """`api_token: ${ACLSERVE_TOKEN}` was the token, as written: the file is not expanded. Refused,
    saying how to give the token; in ACLSERVE_API_TOKEN, a placeholder its setter left (a shell's
    single quotes, a Kubernetes $(NAME) of no variable); a file's, replaced by the variable, too.
    (Its port is taken: a token taken ends the start there, not in a server that serves.)"""
    (tmp_path / "c.yaml").write_text(f"api_token: {json.dumps(token)}\n")
    (tmp_path / "models").mkdir()
    args = [] if where == "environment" else ["--config", "c.yaml"]
    variable = {"environment": token, "replaced": "s3cret"}.get(where)
    env = dict(os.environ, ACLSERVE_API_TOKEN=variable) if variable else None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = _aclserve("serve", "--port", port, "--grpc-port", "0", "--device", "cpu", *args, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "s3cret" not in proc.stderr, proc.stderr
    if where == "environment":
        said = "ACLSERVE_API_TOKEN: is a placeholder such as ${NAME}, $NAME or $(NAME), not expanded by what set it"
    else:
        said = ("c.yaml: api_token: is a placeholder such as ${NAME} or $NAME, taken as written: the config file is "
                "not expanded; give the token in ACLSERVE_API_TOKEN")
    assert f"error: bad configuration: {said}" in proc.stderr, proc.stderr


def test_serve_names_the_command_line_for_a_bad_flag_not_the_config_file(tmp_path):
    """`serve --config c.yaml --cpu-threads 0` said "bad configuration: .../c.yaml: cpu_threads: ..."."""
    (tmp_path / "c.yaml").write_text("port: 0\ngrpc_port: 0\n")
    proc = _aclserve("serve", "--config", "c.yaml", "--cpu-threads", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "c.yaml" not in proc.stderr, proc.stderr
    assert "error: bad configuration: command line: cpu_threads: must be >= 1, got 0" in proc.stderr, proc.stderr


def test_serve_names_the_command_line_for_a_bad_flag_without_a_config_file(tmp_path):
    """`serve --port -1` said "bad configuration: port: must be >= 0, got -1", naming no source."""
    proc = _aclserve("serve", "--port", "-1", "--grpc-port", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "error: bad configuration: command line: port: must be >= 0, got -1" in proc.stderr, proc.stderr


def test_onnx_runtime_telemetry_is_off_and_says_nothing():
    """ONNX Runtime 1.29+ sends telemetry from Linux, and where HOME cannot be written (the
    container's) printed a coloured warning at import that broke --log-format json."""
    env = dict(os.environ, HOME="/proc/no-home")
    env.pop("ORT_DISABLE_TELEMETRY", None)
    proc = subprocess.run([sys.executable, "-c", "import os, aclserve, onnxruntime; print(os.environ['ORT_DISABLE_TELEMETRY'])"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "1" and "telemetry" not in proc.stderr, proc.stderr


def test_serve_says_trace_settings_without_trace_trace_nothing(tmp_path):
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--trace-rate", "1",
                     "--trace-format", "triton", cwd=tmp_path)  # stops at the missing models folder
    assert "--trace-rate, --trace-format given, but tracing is off (no --trace)" in proc.stderr, proc.stderr
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--trace-rate", "1",
                     "--trace", "t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "tracing is off" not in proc.stderr, proc.stderr


def test_serve_refuses_an_empty_trace_file_name(tmp_path):
    """`--trace ''` was taken and traced nothing without a word (a configuration tester's finding)."""
    for args in (("--trace", ""), ("--trace=",)):
        proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "aclserve serve: error: argument --trace: needs a file name, got '' (`aclserve serve --help` lists its "
            "arguments)"], proc.stderr


# every option naming a file or a folder, with what its command needs besides (found by its metavar)
PATH_OPTIONS = {
    ("serve", "--config"): (), ("serve", "--models"): (), ("serve", "--compile-cache-dir"): (),
    ("serve", "--tls-cert"): (), ("serve", "--tls-key"): (), ("serve", "--tls-client-ca"): (), ("serve", "--trace"): (),
    ("profile", "--models"): ("m",), ("profile", "--trace-dir"): ("m",), ("profile", "--trace"): ("m",),
    ("profile", "--png"): ("m",), ("profile", "--cert"): ("m",), ("profile", "--key"): ("m",),
    ("infer", "--cert"): ("m", "-i", "x=x.npy"), ("infer", "--key"): ("m", "-i", "x=x.npy"),
    ("compile", "--output"): ("m.onnx",), ("compile", "--atc"): ("m.onnx",), ("compile", "--aipp"): ("m.onnx",)}


def test_every_option_naming_a_file_or_folder_refuses_an_empty_one(capsys):
    """`serve --tls-cert '' --tls-key ''` served plain HTTP, `profile --trace ''` wrote its default
    file, `compile --aipp ''` compiled without AIPP: an empty value was read as the option not
    given (found in review). Each such option of every command refuses it as `serve --trace ''` did."""
    import argparse
    import aclserve.cli as cli
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    actions = {(name, action.option_strings[-1]): action for name, parser in sub.choices.items()
               for action in parser._actions if action.option_strings and action.metavar in ("FILE", "DIR", "PATH",
                                                                                             "OUT.om")}
    assert set(actions) == set(PATH_OPTIONS)
    for (command, option), needed in sorted(PATH_OPTIONS.items()):
        action = actions[command, option]
        kind, spelt = "folder" if action.metavar == "DIR" else "file", "/".join(action.option_strings)
        for given in ((option, ""), (f"{option}=",)):
            with pytest.raises(SystemExit) as ended:
                cli.main([command, *needed, *given])
            assert ended.value.code == 2 and capsys.readouterr().err.splitlines() == [
                f"aclserve {command}: error: argument {spelt}: needs a {kind} name, got '' "
                f"(`aclserve {command} --help` lists its arguments)"], (command, given)


def test_infer_client_casts_within_a_kind_and_says_so():
    inputs = {"x": np.zeros((2, 64))}
    notes = cast_to_model(inputs, {"inputs": [{"name": "x", "datatype": "FP32"}]})
    assert inputs["x"].dtype == np.float32 and notes == ["input x: float64 cast to FP32 as the model declares"]


def test_infer_client_sends_a_scalar_input_with_its_shape(tmp_path):
    """np.ascontiguousarray turned a 0-d .npy into shape [1], which a model with a scalar input refuses."""
    from aclserve.cli.infer import _load_inputs, build_request
    import json
    np.save(tmp_path / "s.npy", np.float32(-2.5))
    np.save(tmp_path / "f.npy", np.zeros((3, 4), np.float32).T)  # not C-contiguous: still sent in C order
    inputs = _load_inputs([f"x={tmp_path / 's.npy'}", f"t={tmp_path / 'f.npy'}"])
    body, length = build_request(inputs, [])
    head = json.loads(body[:length])
    assert [i["shape"] for i in head["inputs"]] == [[], [4, 3]]
    assert inputs["t"].flags.c_contiguous and len(body) == length + 4 + 48


@pytest.mark.parametrize("case", ["twice", "not npy", "npz", "fifo", "folder"])
def test_infer_inputs_that_cannot_be_sent_are_named_in_one_line(tmp_path, case):
    """A name given twice kept the second file; a file that is not a .npy got numpy's advice on
    loading pickles, an .npz an AttributeError, a FIFO held the command until written to."""
    import os
    from aclserve.cli.infer import _load_inputs
    from aclserve.cli.usage import UsageError
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    good = f"x={tmp_path / 'x.npy'}"
    if case == "twice":
        pairs, expected = [good, good], "--input names 'x' twice"
    elif case == "not npy":
        (tmp_path / "m.onnx").write_bytes(b"\x08\x07garbage")
        pairs, expected = [f"x={tmp_path / 'm.onnx'}"], "not a .npy file"
    elif case == "npz":
        np.savez(tmp_path / "a.npz", x=np.ones(2))
        pairs, expected = [f"x={tmp_path / 'a.npz'}"], "not a .npy file"
    elif case == "fifo":
        os.mkfifo(tmp_path / "pipe")
        pairs, expected = [f"x={tmp_path / 'pipe'}"], "not a regular file"
    else:
        pairs, expected = [f"x={tmp_path}"], "not a regular file"
    with pytest.raises(UsageError, match=expected):
        _load_inputs(pairs)


def test_infer_with_a_malformed_url_says_so(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    for url in ("localhost:8000", "http://[::1"):
        proc = _aclserve("infer", "m", "-i", "x=x.npy", "--url", url, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "--url" in proc.stderr


@pytest.mark.parametrize("url, address", [
    ("http://127.0.0.1:1/v2/models/m", "http://127.0.0.1:1"), ("http://127.0.0.1:1/?a=b", "http://127.0.0.1:1"),
    ("http://127.0.0.1:1/proxy/v2/", "http://127.0.0.1:1/proxy"), ("http://127.0.0.1:1/v2x/v2", "http://127.0.0.1:1/v2x")])
def test_a_url_ending_in_the_api_s_path_is_refused_naming_the_server_s_address(url, address):
    """(the check both commands make: one command line each below)"""
    with pytest.raises(UsageError) as refused:
        check_url(url)
    assert str(refused.value) == f"--url {url!r}: give the server's address alone, {address} (the command adds " \
                                 "/v2/models/... to it)"


@pytest.mark.parametrize("command", [("infer", "m", "-i", "x=x.npy"), ("profile", "m")])
def test_a_url_with_the_api_s_path_is_refused_naming_the_server_s_address(tmp_path, command):
    """`--url http://127.0.0.1:8000/v2` was taken and ended in `HTTP 404: no route for POST
    /v2/v2/models/digits/infer` (tester t69): the commands add the API's path to the server's address."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = _aclserve(*command, "--url", "http://127.0.0.1:1/v2", cwd=tmp_path)  # (nothing listens on port 1)
    assert proc.returncode == 2 and proc.stderr == (
        f"aclserve {command[0]}: error: --url 'http://127.0.0.1:1/v2': give the server's address alone, "
        "http://127.0.0.1:1 (the command adds /v2/models/... to it)\n"), proc.stderr


@pytest.mark.parametrize("command, url", [(("infer", "m", "-i", "x=x.npy"), "http://127.0.0.1:1/aclserve"),
                                          (("profile", "m"), "http://127.0.0.1:1/gw/v2/aclserve/")])
def test_a_url_with_a_prefix_path_is_taken_as_a_proxy_s(tmp_path, command, url):
    """A path not ending in the API's (a reverse proxy's prefix) is the server's address: requests go below it."""
    check_url(url)  # (both commands check it so)
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = _aclserve(*command, "--url", url, "--timeout", "5", cwd=tmp_path)
    assert proc.returncode == 1 and f"cannot reach {url}" in proc.stderr, proc.stderr


def test_compile_to_an_output_that_cannot_be_written_says_why(tmp_path):
    from tests.tiny_models import scale_onnx

    scale_onnx(tmp_path / "s.onnx", 2.0)
    (tmp_path / "taken.om").mkdir()  # a folder where the .om should go
    proc = _aclserve("compile", "s.onnx", "-o", "taken.om", "--target", "cpu", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "taken.om" in proc.stderr


def test_profile_user_mistakes_are_one_line_each(tmp_path):
    cases = [(("--url", "nonsense"), "--url"),
             (("--url", "http://127.0.0.1:1"), "cannot reach"),  # nothing listens on port 1
             (("--url", "http://127.0.0.1:1", "--trace", "no/such/folder/t.json"), "no/such/folder"),
             (("--url", "http://127.0.0.1:1", "--png", "no/such/folder/t.png"), "no/such/folder"),
             # flags of the other mode did nothing
             (("--url", "http://127.0.0.1:1", "--models", "elsewhere"), "--models applies to the in-process mode"),
             (("--url", "http://127.0.0.1:1", "--device", "cpu"), "--device applies to the in-process mode"),
             (("--trace-dir", "traces"), "--trace-dir applies with --url"),
             (("--timeout", "5"), "--timeout applies with --url"),
             (("--url", "http://127.0.0.1:1", "--timeout", "nan"), "--timeout must be a positive number"),
             # as infer's (it took 1e12: a tester, t86)
             (("--url", "http://127.0.0.1:1", "--timeout", "1e12"), "at most 2,592,000 (30 days)")]
    for args, said in cases:
        proc = _aclserve("profile", "m", "--seconds", "1", *args, cwd=tmp_path)
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr


def test_a_models_folder_that_cannot_be_reached_is_said_so(tmp_path, monkeypatch):
    """A folder on the way that cannot be searched (EACCES; simulated: the tests run as root)
    was a bare "[Errno 13] Permission denied: 'locked/inner'"."""
    from pathlib import Path

    from aclserve.repository import RepositoryError, check_models_folder
    real_stat = Path.stat

    def stat(self, *args, **kwargs):
        if self.name == "inner":
            raise PermissionError(13, "Permission denied")
        return real_stat(self, *args, **kwargs)
    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(RepositoryError, match="models folder .*inner cannot be reached .Permission denied."):
        check_models_folder(tmp_path / "locked" / "inner")


def _as_a_user_without_read_permission() -> list[str] | None:
    """The command prefix that runs aclserve as one whom file permissions bind: none for a user
    other than root; for root, setpriv dropping the capabilities that read past them (None when
    it cannot, in a container without them, say)."""
    if os.geteuid() != 0:
        return []
    dropped = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    try:
        probe = subprocess.run([*dropped, "true"], capture_output=True, timeout=30)
    except OSError:
        return None
    return dropped if probe.returncode == 0 else None


@pytest.mark.parametrize("mode", [0o000, 0o644], ids=["000", "644"])
def test_serve_on_a_models_folder_it_cannot_read_says_so_and_does_not_start(tmp_path, mode):
    """`chmod 000 models` (or 644: listed, nothing in it looked at) started the server, never
    ready, its reason in one WARNING line and the repository index; 644 ended it on the first
    scan with a bare "[Errno 13] Permission denied: '.../digits.om'" once it listened. It stops
    before it listens, in explicit mode too (it loads every model at start); so does the
    in-process profile, which loads the folder as serve does."""
    prefix = _as_a_user_without_read_permission()
    if prefix is None:
        pytest.skip("no way to run as a user file permissions bind (root without setpriv)")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    (tmp_path / "models").chmod(mode)
    try:
        runs = [subprocess.run([*prefix, sys.executable, "-m", "aclserve", *command, "--device", "cpu"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
                for command in (["serve", "--port", "0", "--grpc-port", "0"],
                                ["serve", "--port", "0", "--grpc-port", "0", "--model-control-mode", "explicit"],
                                ["profile", "digits", "--seconds", "0.5", "--trace", str(tmp_path / "t.json")])]
    except subprocess.TimeoutExpired as e:  # (run() has killed it)
        pytest.fail(f"the server started: {e.stderr}")
    finally:
        (tmp_path / "models").chmod(0o755)
    for proc, command in zip(runs, ("serve", "serve", "profile")):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "listening" not in proc.stderr, proc.stderr
        assert proc.stderr == f"aclserve {command}: error: models folder models cannot be read (Permission denied): " \
                              "the user aclserve runs as needs read and search permission on it (r-x)\n", proc.stderr


def test_serve_with_a_file_as_models_folder_says_it_is_a_file(tmp_path):
    (tmp_path / "m.om").write_bytes(b"x")
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--models", "m.om", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "m.om is a file, not a folder" in proc.stderr and "listening" not in proc.stderr, proc.stderr


def test_serve_on_a_busy_grpc_port_says_so_in_one_error(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (tmp_path / "models").mkdir()  # (a missing one is refused before anything listens)
        proc = _aclserve("serve", "--port", "0", "--grpc-port", str(port), "--device", "cpu", cwd=tmp_path)
    # its one line: not grpc core's own (add_port.cc), nor the runtime's start or HTTP's "listening" before it,
    # nor a shutdown's lines after it (an operator looking for those found false ones)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"aclserve serve: error: gRPC cannot listen on 127.0.0.1:{port}: Address already in use (--grpc-port PORT "
        "moves it, --grpc-port 0 turns gRPC off)"], proc.stderr


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
    proc = _aclserve("serve", "--host", host, "--port", "0", "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() in ([f"aclserve serve: error: cannot listen on {host}:0: {why}"] for why in whys), \
        proc.stderr


def test_serve_on_a_busy_http_port_says_so_in_one_error(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (tmp_path / "models").mkdir()  # (a missing one is refused before anything listens)
        proc = _aclserve("serve", "--port", str(port), "--grpc-port", "0", "--device", "cpu", cwd=tmp_path)
        as_json = _aclserve("serve", "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--log-format", "json",
                            cwd=tmp_path)
    said = f"cannot listen on 127.0.0.1:{port}: Address already in use (--port PORT moves it)"
    # its one line: not the runtime's start before it, nor a shutdown's lines after it
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"aclserve serve: error: {said}"], proc.stderr
    # with JSON logs the line saying why it stopped is a JSON line too (a log shipper reads only those)
    assert as_json.returncode == 2 and len(as_json.stderr.splitlines()) == 1, as_json.stderr
    last = json.loads(as_json.stderr.splitlines()[-1])
    assert last["level"] == "critical" and last["message"] == f"aclserve serve: error: {said}", as_json.stderr


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
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", *args, cwd=tmp_path,
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
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", cwd=tmp_path,
                     env={**os.environ, **env})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert said in proc.stderr, proc.stderr


def test_profile_says_in_one_line_what_it_cannot_profile(tmp_path):
    models = tmp_path / "models"  # (apart from the folder the trace goes to: profile writes nothing in it)
    models.mkdir()
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om"):
        shutil.copy(REPO / "models" / name, models / name)
    cases = [(("digits_image",), "takes encoded images (BYTES)"),
             (("digits", "--rows", "100000"), "exceeds the model's max_batch_size"),
             (("digits", "--device", "npu"), "CANN's `acl` module is not importable")]
    for args, said in cases:
        proc = _aclserve("profile", *args, "--seconds", "1", "--models", str(models), cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr
    proc = _aclserve("profile", "digits", "--seconds", "nan", "--models", str(models), cwd=tmp_path)
    assert proc.returncode == 2 and "--seconds finite" in proc.stderr
    assert not (tmp_path / "profile-digits.json").exists()


def test_profile_refuses_what_it_could_not_write_before_the_run(tmp_path):
    """A folder as --trace or --png was a traceback after the whole run (or, for --png, a
    folder.png beside it); a negative --png-window-ms drew an empty timeline."""
    (tmp_path / "out").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    cases = [(("--trace", "out"), "cannot write out: it is a folder"),
             (("--png", "out"), "cannot write out: it is a folder"),
             (("--png", "t.png", "--png-window-ms", "-5"), "--png-window-ms must be positive"),
             (("--png-window-ms", "-3"), "--png-window-ms must be positive"),  # (was taken without --png)
             (("--models", "file"), "models folder 'file' is a file, not a folder")]
    for args, said in cases:
        proc = _aclserve("profile", "digits", "--seconds", "0.5", "--models", "models", *args, cwd=tmp_path,
                         timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["file", "models", "out"]


def test_profile_png_is_written_to_the_name_given(tmp_path):
    """matplotlib took the format from the name: "timeline" became timeline.png, "t.txt" a traceback."""
    pytest.importorskip("matplotlib")
    from aclserve.trace.plot import render_png
    events = [{"ph": "X", "name": "compute", "pid": 1, "tid": 1, "ts": 0.0, "dur": 5000.0}]
    for name in ("timeline", "t.txt"):
        render_png(events, str(tmp_path / name), 20.0)
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name
    assert sorted(os.listdir(tmp_path)) == ["t.txt", "timeline"]


def test_serve_with_a_trace_file_it_cannot_write_says_so_at_start(tmp_path):
    """The traces were written at shutdown only, so they were lost with one ERROR then (found by
    an independent check)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "file").write_text("")
    proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", "--trace", "file/t.json",
                     cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the trace file file/t.json" in proc.stderr, proc.stderr


def test_serve_with_a_folder_as_trace_file_says_so_at_start(tmp_path):
    """A folder passed the folder check: the server ran and lost its traces at shutdown with one
    ERROR ("Is a directory") and exit status 0; and a file above the folder said "File exists"."""
    (tmp_path / "models").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "file").write_text("")
    for trace, said in (("traces", "traces: it is a folder"), ("file/a/t.json", "file is a file, not a folder")):
        proc = _aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", "--trace", trace,
                         cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr


def test_a_device_named_in_the_config_or_cli_wins_over_aclserve_device_and_auto_defers_to_it():
    """select() in fresh processes (its first choice sticks for a process)."""
    code = "import sys; from aclserve.acl import select; print(select(sys.argv[1] or None)[0])"
    # (" cpu ": the CLI's check strips it, select() did not: a traceback, found by a helper)
    for device, env, kind in (("cpu", "npu", "cpu"), ("auto", "cpu", "cpu"), ("", "cpu", "cpu"), ("", " cpu ", "cpu")):
        proc = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "ACLSERVE_DEVICE": env})
        assert proc.returncode == 0 and proc.stdout.strip() == kind, (device, env, proc.stderr)
    proc = subprocess.run([sys.executable, "-c", code, "auto"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ACLSERVE_DEVICE": "npu"})  # no machine here has CANN
    assert proc.returncode == 1 and "CANN's `acl` module is not importable" in proc.stderr


def test_serve_takes_a_folder_as_trace_file_when_log_frequency_writes_beside_it(tmp_path):
    """With --trace-log-frequency the files are FILE.0, FILE.1, ... beside FILE, so FILE may be a
    folder (the tracer takes such a name through the API: fce3055); the start-up check refused
    it as "it is a folder", a set-up that worked before."""
    from aclserve.cli.serve import _check_trace_folder
    from aclserve.cli.usage import UsageError
    (tmp_path / "run").mkdir()
    _check_trace_folder(str(tmp_path / "run"), log_frequency=100)
    with pytest.raises(UsageError, match="it is a folder"):
        _check_trace_folder(str(tmp_path / "run"), log_frequency=0)


def test_a_server_of_many_models_names_the_first_ones_then_how_many_more():
    """The models named instead of one the server does not know: 20, then how many more, in the
    words every list of names a message cuts short takes (aclserve/quoting.py's listed_names)."""
    from aclserve.cli.usage import MODELS_LISTED, models_hint
    names = [f"m{i:02}" for i in range(MODELS_LISTED + 3)]
    assert models_hint(reversed(names)) == f" (models ready: {', '.join(names[:MODELS_LISTED])} and 3 more)"


def test_compile_takes_a_negative_batch_to_refuse_it_and_names_atcs_spelling_of_its_options(tmp_path):
    """`--batch -1,2` got argparse's "expected one argument" (it takes -1,2 for an option), and ATC's
    `--input_shape` was "unrecognized" with no word of `--input-shape` (found by a tester)."""
    help_of = "(`aclserve compile --help` lists its arguments)"
    for args, said in ((("--batch", "-1,2"), "aclserve compile: error: --batch sizes must be positive, got -1,2"),
                       (("--input_shape", "x:-1,3"), "aclserve compile: error: unrecognized arguments: --input_shape "
                                                     f"x:-1,3; did you mean --input-shape? {help_of}"),
                       (("--soc_version=Ascend310P3", "--bogus"), "aclserve compile: error: unrecognized arguments: "
                        f"--soc_version=Ascend310P3 --bogus; did you mean --soc-version? {help_of}"),
                       (("--bogus_flag",), f"aclserve compile: error: unrecognized arguments: --bogus_flag {help_of}")):
        proc = _aclserve("compile", "m.onnx", "--target", "cpu", *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip() == said, proc.stderr


def test_a_bad_flag_of_any_command_is_one_line_saying_where_the_help_is(tmp_path):
    """serve, infer and profile printed argparse's 13-line usage block before the error, where
    compile and inspect (and every UsageError) print one line (found by a helper's fuzz); that line
    then said no more, a bare `aclserve` only "the following arguments are required: COMMAND"."""
    help_of = "lists its arguments)"
    for args, said in ((("serve", "--port", "abc"), f"serve: error: argument --port: invalid int value: 'abc' ("
                                                    f"`aclserve serve --help` {help_of}"),
                       ((), "aclserve: error: the following arguments are required: COMMAND (serve, infer, profile, "
                            "compile or inspect; `aclserve --help` says what each does)"),
                       (("infer",), f"infer: error: the following arguments are required: model, --input/-i ("
                                    f"`aclserve infer --help` {help_of}"),
                       (("profile", "--seconds", "soon"), f"argument --seconds: invalid float value: 'soon' ("
                                                          f"`aclserve profile --help` {help_of}"),
                       (("serve", "--bogus"), f"aclserve serve: error: unrecognized arguments: --bogus ("
                                              f"`aclserve serve --help` {help_of}")):
        proc = _aclserve(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert proc.stderr.rstrip("\n").endswith(said), proc.stderr
