"""What a new user meets at the command line: help that describes the tool, a mistake said in one
line saying where the help is, no tracebacks."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from aclserve.cli.remote import check_url
from aclserve.cli.usage import UsageError

from tests import REPO
from tests.aclserve_command import run_aclserve


def test_top_level_help_describes_the_tool():
    out = run_aclserve("--help").stdout
    assert "KServe v2" in out and "aclserve serve" in out and "argparse" not in out


def test_serve_help_says_what_debug_logs():
    """"debug also logs every request" was not so: only aiohttp's access log is added, which no
    gRPC call reaches (an SRE's audit); the request log is the one for every infer request."""
    out = " ".join(run_aclserve("serve", "--help").stdout.split())
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


def test_compile_takes_its_target_in_any_case(tmp_path):
    """--target CPU was "unknown target 'CPU'"."""
    proc = run_aclserve("compile", str(REPO / "models" / "digits.onnx"), "-o", str(tmp_path / "d.om"), "--target",
                        "CPU")
    assert proc.returncode == 0 and (tmp_path / "d.om").exists(), proc.stderr


def test_serve_takes_its_named_choices_in_any_case(tmp_path):
    """--log-level INFO was "invalid choice" while log_level: INFO in a file was taken."""
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "CPU", "--log-level", "INFO",
                        "--readiness", "Lenient", "--model-control-mode", "None", "--log-format", "JSON",
                        "--trace-format", "Triton", cwd=tmp_path)
    assert "invalid choice" not in proc.stderr and "does not exist" in proc.stderr, proc.stderr  # (no models/)


def test_onnx_runtime_telemetry_is_off_and_says_nothing():
    """ONNX Runtime 1.29+ sends telemetry from Linux, and where HOME cannot be written (the
    container's) printed a coloured warning at import that broke --log-format json."""
    env = dict(os.environ, HOME="/proc/no-home")
    env.pop("ORT_DISABLE_TELEMETRY", None)
    proc = subprocess.run([sys.executable, "-c", "import os, aclserve, onnxruntime; print(os.environ['ORT_DISABLE_TELEMETRY'])"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "1" and "telemetry" not in proc.stderr, proc.stderr


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


def test_infer_with_a_malformed_url_says_so(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    for url in ("localhost:8000", "http://[::1"):
        proc = run_aclserve("infer", "m", "-i", "x=x.npy", "--url", url, cwd=tmp_path)
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
    proc = run_aclserve(*command, "--url", "http://127.0.0.1:1/v2", cwd=tmp_path)  # (nothing listens on port 1)
    assert proc.returncode == 2 and proc.stderr == (
        f"aclserve {command[0]}: error: --url 'http://127.0.0.1:1/v2': give the server's address alone, "
        "http://127.0.0.1:1 (the command adds /v2/models/... to it)\n"), proc.stderr


@pytest.mark.parametrize("command, url", [(("infer", "m", "-i", "x=x.npy"), "http://127.0.0.1:1/aclserve"),
                                          (("profile", "m"), "http://127.0.0.1:1/gw/v2/aclserve/")])
def test_a_url_with_a_prefix_path_is_taken_as_a_proxy_s(tmp_path, command, url):
    """A path not ending in the API's (a reverse proxy's prefix) is the server's address: requests go below it."""
    check_url(url)  # (both commands check it so)
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = run_aclserve(*command, "--url", url, "--timeout", "5", cwd=tmp_path)
    assert proc.returncode == 1 and f"cannot reach {url}" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [("infer", "m", "-i", "x=x.npy"), ("profile", "m", "--seconds", "1")])
def test_a_port_nothing_listens_on_is_said_with_the_next_step(tmp_path, command):
    """`cannot reach http://127.0.0.1:8000: Connection refused` was all a new user read, with no
    server started: the line says what to check, still one line and exit status 1."""
    import socket
    with socket.socket() as held:  # (bound, never listening: refused, and no other process takes the port)
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        proc = run_aclserve(*command, "--url", url, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == (
        f"aclserve {command[0]}: error: cannot reach {url}: Connection refused (is `aclserve serve` running there? "
        "--url names another server)\n"), proc.stderr


def test_compile_to_an_output_that_cannot_be_written_says_why(tmp_path):
    from tests.tiny_models import scale_onnx

    scale_onnx(tmp_path / "s.onnx", 2.0)
    (tmp_path / "taken.om").mkdir()  # a folder where the .om should go
    proc = run_aclserve("compile", "s.onnx", "-o", "taken.om", "--target", "cpu", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "taken.om" in proc.stderr


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
        proc = run_aclserve("compile", "m.onnx", "--target", "cpu", *args, cwd=tmp_path)
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
        proc = run_aclserve(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert proc.stderr.rstrip("\n").endswith(said), proc.stderr
