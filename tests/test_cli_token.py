"""`aclserve infer` and `aclserve profile --url` against a server with an API token: they could
not send one (inference with `auth_inference`, and the trace setting changes `profile` makes,
need it); they send ACLSERVE_API_TOKEN now, and a URL with credentials in it is refused
without echoing them (urllib took `user:pw@host` for a host name)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

from tests import REPO
from tests.serving import ServerThread, server_config

TOKEN = "t0ken-for-the-cli-test"


def _aclserve(*args, cwd, token=None):
    env = {k: v for k, v in os.environ.items() if k != "ACLSERVE_API_TOKEN"}
    if token is not None:
        env["ACLSERVE_API_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120)


def test_client_commands_send_the_api_token_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ACLSERVE_API_TOKEN", raising=False)  # the server takes api_token below
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    (tmp_path / "traces").mkdir()
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    config = server_config(tmp_path / "models", api_token=TOKEN, auth_inference=True,
                           trace_dir=str(tmp_path / "traces"))
    with ServerThread(config) as server:
        url = f"http://{server.url}"
        infer = ["infer", "digits", "-i", "x=x.npy", "--url", url]
        without = _aclserve(*infer, cwd=tmp_path)
        wrong = _aclserve(*infer, cwd=tmp_path, token="not-it")
        right = _aclserve(*infer, cwd=tmp_path, token=TOKEN)
        profile = ["profile", "digits", "--url", url, "--trace-dir", "traces", "--seconds", "0.5",
                   "--clients", "2", "--trace", "out.json"]
        profiled = _aclserve(*profile, cwd=tmp_path, token=TOKEN)
        refused = _aclserve(*profile, cwd=tmp_path)
    assert without.returncode == 1 and "HTTP 401" in without.stderr, without.stderr
    assert "(ACLSERVE_API_TOKEN is not set)" in without.stderr
    assert wrong.returncode == 1 and "(ACLSERVE_API_TOKEN is not the server's token)" in wrong.stderr, wrong.stderr
    assert right.returncode == 0 and right.stdout.startswith("y float32 [1, 10]"), right.stderr
    assert profiled.returncode == 0 and "Traceback" not in profiled.stderr, profiled.stderr
    assert "requests answered" in profiled.stdout and (tmp_path / "out.json").stat().st_size > 100
    assert refused.returncode != 0 and "(ACLSERVE_API_TOKEN is not set)" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


def test_a_url_with_credentials_is_refused_without_echoing_them(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    for args in (["infer", "m", "-i", "x=x.npy"], ["profile", "m"]):
        proc = _aclserve(*args, "--url", "http://someone:pa55word@127.0.0.1:1", cwd=tmp_path)
        assert proc.returncode == 2 and "pa55word" not in proc.stderr, proc.stderr
        assert "credentials in the URL are not sent" in proc.stderr and "ACLSERVE_API_TOKEN" in proc.stderr


def test_a_token_no_header_can_carry_is_named_not_sent(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    proc = _aclserve("infer", "m", "-i", "x=x.npy", "--url", "http://127.0.0.1:1", cwd=tmp_path,
                     token="two\nlines")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "ACLSERVE_API_TOKEN cannot be sent in a header" in proc.stderr and "lines" not in proc.stderr


def _metric(url: str, name: str, token: str | None = None) -> float:
    import urllib.request
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{url}/metrics", headers=headers)
    text = urllib.request.urlopen(request, timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_profile_without_the_token_a_server_needs_for_trace_settings_is_its_error_alone_before_any_load(
        tmp_path, monkeypatch):
    """Inference open, the trace settings' changes needing the token, `profile --url` run without
    it: it drove its warm-up load, was refused turning tracing on, then posted tracing OFF and the
    settings' put-back (two 401s more, counted as refusals) and warned that it could not put back
    settings it never changed, printing them as a Python dict, before the error."""
    monkeypatch.delenv("ACLSERVE_API_TOKEN", raising=False)  # the server takes api_token below
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    (tmp_path / "traces").mkdir()
    config = server_config(tmp_path / "models", api_token=TOKEN, trace_dir=str(tmp_path / "traces"))
    with ServerThread(config) as server:
        refused = _aclserve("profile", "digits", "--url", f"http://{server.url}", "--trace-dir", "traces",
                            "--seconds", "0.5", "--clients", "2", "--trace", "out.json", cwd=tmp_path)
        refusals = _metric(server.url, "aclserve_auth_refusals_total{")
        answered = _metric(server.url, 'aclserve_request_success_total{model="digits"')
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(f"aclserve profile: error: http://{server.url}: could not change the model's "
                                     "trace settings: HTTP 401: ") and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.endswith("(ACLSERVE_API_TOKEN is not set)\n"), refused.stderr
    assert refusals == 1 and answered == 0  # found by its one refused change, before any request was sent
    assert os.listdir(tmp_path / "traces") == [] and not (tmp_path / "out.json").exists()


def test_settings_that_cannot_be_put_back_are_said_as_the_json_to_post(tmp_path, monkeypatch, capsys):
    """The warning printed them as a Python dict ({'trace_level': None, ...})."""
    import asyncio
    import json

    import aiohttp

    from aclserve.cli.profile_remote import _put_back

    monkeypatch.delenv("ACLSERVE_API_TOKEN", raising=False)
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    restore = {"trace_level": None, "trace_rate": "10", "trace_file": None}
    with ServerThread(server_config(tmp_path / "models", api_token=TOKEN)) as server:
        setting = f"http://{server.url}/v2/models/digits/trace/setting"

        async def put_back_without_the_token():
            async with aiohttp.ClientSession() as session:
                await _put_back(session, setting, restore)
        asyncio.run(put_back_without_the_token())
    said = capsys.readouterr().err
    assert said.startswith("aclserve profile: warning: could not put the model's trace settings back (HTTP 401: ")
    assert said.endswith(f"; to do so, POST this to {setting}: {json.dumps(restore)}\n"), said
    assert "None" not in said and "'" not in said.split("; to do so")[1], said


def test_infer_refused_its_token_asks_once(tmp_path, monkeypatch):
    """The metadata request's 401 was taken for "no metadata to read", and the infer request then
    got a second 401: every `infer` with a wrong token or none counted 2 refusals (t56). Now the
    first ends the command, in the words and exit status the infer request's 401 had."""
    monkeypatch.delenv("ACLSERVE_API_TOKEN", raising=False)  # the server takes api_token below
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    config = server_config(tmp_path / "models", api_token=TOKEN, auth_inference=True)
    with ServerThread(config) as server:
        infer = ["infer", "digits", "-i", "x=x.npy", "--url", f"http://{server.url}"]
        wrong = _aclserve(*infer, cwd=tmp_path, token="not-it")
        invalid = _metric(server.url, 'aclserve_auth_refusals_total{reason="invalid_token"}', TOKEN)
        without = _aclserve(*infer, cwd=tmp_path)
        missing = _metric(server.url, 'aclserve_auth_refusals_total{reason="no_token"}', TOKEN)
    assert (invalid, missing) == (1, 1)
    assert wrong.returncode == 1 and wrong.stderr == ("aclserve infer: error: HTTP 401: the API token is not valid "
                                                      "(ACLSERVE_API_TOKEN is not the server's token)\n"), wrong.stderr
    assert without.returncode == 1 and without.stderr.startswith("aclserve infer: error: HTTP 401: this route needs "
                                                                 "an API token"), without.stderr
    assert without.stderr.endswith("(ACLSERVE_API_TOKEN is not set)\n") and without.stderr.count("\n") == 1
