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
