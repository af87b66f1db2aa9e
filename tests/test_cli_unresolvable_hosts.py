"""A host no resolver can be asked about (an empty label, one over 63 characters): Python's
resolver calls encode it with the idna codec first, which raises UnicodeError, not the OSError of a
name that does not resolve, and `serve`, `infer` and `profile --url` each ended in a traceback (a
tester, t92). Now `serve` says so in its one error line (exit 2), the clients as of any host they
cannot reach (exit 1); and a host echoed is cut (a `host:` of 1 MB was an error line of 1 MB)."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import REPO

LONG_LABEL = "a" * 64


def _aclserve(*args, cwd):
    return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def models_folder(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models")
    return tmp_path


@pytest.mark.parametrize("host, shown", [("a..b", "a..b"), (LONG_LABEL, LONG_LABEL),
                                         # (an address's zone is such a name too: create_server looked it up)
                                         ("fe80::1%x..y", "[fe80::1%x..y]")])
def test_serve_on_a_host_no_resolver_takes_says_so_in_one_error(models_folder, host, shown):
    proc = _aclserve("serve", "--host", host, "--port", "0", "--grpc-port", "0", "--device", "cpu", cwd=models_folder)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"aclserve serve: error: cannot listen on {shown}:0: not a valid host name ("), proc.stderr


@pytest.mark.parametrize("host, why", [(".example", "not a valid host name ("),
                                       # one a resolver is asked about, and refuses, is cut as well
                                       # (under the 256 KiB a config file may be: config/files.py)
                                       ("a." * 100_000, ""),
                                       ("a" * 200_000, "not a valid host name (")],
                         # (named: a test's id is in PYTEST_CURRENT_TEST, each child's environment: 1 MB was E2BIG)
                         ids=["empty first label", "200 KB of labels", "200 KB label"])
def test_a_configured_host_it_cannot_listen_on_is_said_in_one_bounded_line(models_folder, host, why):
    (models_folder / "server.yaml").write_text(f'host: "{host}"\n')
    proc = _aclserve("serve", "--config", "server.yaml", "--port", "0", "--grpc-port", "0", "--device", "cpu",
                     cwd=models_folder)
    assert proc.returncode == 2, proc.stderr[:2000]
    error = proc.stderr.splitlines()[-1]  # (after the line saying the config file was read)
    shown = host if len(host) <= 256 else f"{host[:256]}... ({len(host) - 256:,} more characters)"
    assert error.startswith(f"aclserve serve: error: cannot listen on {shown}:0: {why}"), error[:2000]
    assert "Traceback" not in proc.stderr and len(error) < 500, error[:2000]


@pytest.mark.parametrize("command, url", [
    ("infer", "http://a..b:9"),
    ("infer", f"https://{LONG_LABEL}.example:9"),  # (over TLS alike)
    ("infer", "http://a%2e%2eb:9"),  # (urllib unquotes the host: a..b)
    ("profile", "http://.example:9"),
    ("profile", f"https://{LONG_LABEL}:9")])
def test_a_client_says_a_host_no_resolver_takes_cannot_be_reached(tmp_path, command, url):
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    args = ("infer", "m", "-i", "x=x.npy") if command == "infer" else ("profile", "m", "--seconds", "1")
    proc = _aclserve(*args, "--url", url, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"aclserve {command}: error: cannot reach {url}: not a valid host name (") \
        and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_infer_says_a_host_urllib_refuses_cannot_be_reached(tmp_path):
    """A blank in the host: http.client refuses the URL before connecting, which `infer` said as
    "did not answer as a KServe v2 HTTP server", when nothing had been sent to anything."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = _aclserve("infer", "m", "-i", "x=x.npy", "--url", "http://a b:9", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("aclserve infer: error: cannot reach http://a b:9: "), \
        proc.stderr
