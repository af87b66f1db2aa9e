"""`aclserve infer` and `aclserve profile --url` against a real mutual-TLS server (tls_client_ca_file):
--cert/--key show a client certificate. Before, neither could show one: "EOF occurred in violation
of protocol" and "Server disconnected", with no hint of why (a tester's find)."""
from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import trustme

from tests import REPO
from tests.serving import ServerThread, server_config


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """(folder, URL, environment trusting the server's CA): digits behind mutual TLS, with files
    client_cert.pem / client_key.pem of a client its CA signed, and both in one file, client.pem."""
    folder = tmp_path_factory.mktemp("mtls_cli")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1")
    server.private_key_pem.write_to_path(str(folder / "key.pem"))
    (folder / "cert.pem").write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
    server_ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(folder / "client_ca.pem"))
    client = client_ca.issue_cert("me@example.test")
    client.private_key_pem.write_to_path(str(folder / "client_key.pem"))
    chain = b"".join(pem.bytes() for pem in client.cert_chain_pems)
    (folder / "client_cert.pem").write_bytes(chain)
    (folder / "client.pem").write_bytes(chain + client.private_key_pem.bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    for name, not_before, not_after in (("expired", now - 30 * day, now - day), ("future", now + day, now + 30 * day)):
        dated = client_ca.issue_cert("me@example.test", not_before=not_before, not_after=not_after)  # (its CA's)
        dated.private_key_pem.write_to_path(str(folder / f"{name}_key.pem"))
        (folder / f"{name}_cert.pem").write_bytes(b"".join(pem.bytes() for pem in dated.cert_chain_pems))
    (folder / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", folder / "models")
    np.save(folder / "x.npy", np.ones((1, 64), np.float32))
    (folder / "traces").mkdir()
    config = server_config(folder / "models", model_control_mode="none", trace_dir=str(folder / "traces"),
                           tls_cert_file=str(folder / "cert.pem"),
                           tls_key_file=str(folder / "key.pem"), tls_client_ca_file=str(folder / "client_ca.pem"))
    with ServerThread(config) as running:
        yield folder, f"https://{running.url}", {**os.environ, "SSL_CERT_FILE": str(folder / "ca.pem")}


def _aclserve(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "aclserve", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


HINT = "--cert FILE [--key FILE] shows one)"


@pytest.mark.parametrize("cert", [("--cert", "client_cert.pem", "--key", "client_key.pem"), ("--cert", "client.pem")],
                         ids=["cert and key", "both in one file"])
def test_infer_shows_its_client_certificate(mtls, cert):
    folder, url, env = mtls
    proc = _aclserve("infer", "digits", "-i", "x=x.npy", "--url", url, *cert, cwd=folder, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("y float32 [1, 10]"), proc.stderr


def test_profile_url_shows_its_client_certificate(mtls):
    folder, url, env = mtls
    proc = _aclserve("profile", "digits", "--url", url, "--seconds", "0.5", "--clients", "1", "--trace",
                     "profile.json", "--cert", "client_cert.pem", "--key", "client_key.pem", cwd=folder, env=env)
    assert proc.returncode == 0 and "requests answered" in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", [("infer", "digits", "-i", "x=x.npy"), ("profile", "digits", "--seconds", "0.5")],
                         ids=["infer", "profile"])
def test_without_a_client_certificate_the_failure_says_how_to_show_one(mtls, command):
    folder, url, env = mtls
    proc = _aclserve(*command, "--url", url, cwd=folder, env=env)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.rstrip("\n").endswith(HINT), proc.stderr


@pytest.mark.parametrize("command", [("infer", "digits", "-i", "x=x.npy"), ("profile", "digits", "--seconds", "0.5")],
                         ids=["infer", "profile"])
@pytest.mark.parametrize("name, why", [("expired", "expired on "), ("future", "is not valid before ")])
def test_a_client_certificate_out_of_date_is_said_so(mtls, command, name, why):
    """A certificate its CA signed but expired (or not valid yet) was said to be one "its CAs did
    not sign" (a tester, t59): the server ends the handshake without a why. The hint now reads the
    --cert file's dates."""
    folder, url, env = mtls
    proc = _aclserve(*command, "--url", url, "--cert", f"{name}_cert.pem", "--key", f"{name}_key.pem", cwd=folder,
                     env=env)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"(the client certificate {name}_cert.pem {why}" in proc.stderr, proc.stderr
    assert "did not sign" not in proc.stderr and proc.stderr.rstrip("\n").endswith("this machine's clock is wrong)")


@pytest.mark.parametrize("options, said", [
    (("--key", "client_key.pem"), "--key goes with --cert"),
    (("--cert", "client_cert.pem", "--url", "http://127.0.0.1:1"), "--cert is shown to a TLS server: give an https://"),
    (("--cert", "missing.pem"), "--cert/--key: cannot read missing.pem: No such file or directory"),
    # (its key not in the file: "not a PEM certificate and its private key", a tester, t86)
    (("--cert", "client_cert.pem"), "--cert client_cert.pem: the private key is missing (the file holds no PRIVATE "
                                    "KEY block): give the key's file as --key FILE, or append the key to the "
                                    "certificate's file"),
    (("--cert", "client_key.pem"), "--cert client_key.pem holds a private key, no PEM certificate: give it as --key"),
    (("--cert", "client_cert.pem", "--key", "ca.pem"), "--key ca.pem holds no PEM private key"),
    (("--cert", "client_cert.pem", "--key", "key.pem"), "--cert client_cert.pem --key key.pem: not a PEM certificate "
                                                        "and its private key (the key is not the certificate's)"),
])
def test_client_certificate_files_that_cannot_be_shown_are_one_line(mtls, options, said):
    folder, url, env = mtls
    if "--url" not in options:
        options = (*options, "--url", url)
    proc = _aclserve("infer", "digits", "-i", "x=x.npy", *options, cwd=folder, env=env)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"aclserve infer: error: {said}"), proc.stderr


def test_profile_in_process_refuses_a_client_certificate(tmp_path):
    proc = _aclserve("profile", "digits", "--cert", "c.pem", cwd=tmp_path, env=os.environ)
    assert proc.returncode == 2 and "--cert and --key apply with --url" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [("infer", "digits", "-i", "x=x.npy"), ("profile", "digits", "--seconds", "0.5")],
                         ids=["infer", "profile"])
def test_a_trust_file_that_cannot_be_read_is_bad_input_before_connecting(mtls, command):
    """SSL_CERT_FILE naming no file was passed over by OpenSSL without a word: the server's
    certificate was then "not trusted here", exit 1 (a tester, t86). An http:// URL uses no CA."""
    folder, url, env = mtls
    env = {**env, "SSL_CERT_FILE": str(folder / "gone.pem")}
    missing = _aclserve(*command, "--url", url, "--cert", "client.pem", cwd=folder, env=env)
    plain = _aclserve(*command, "--url", "http://127.0.0.1:1", cwd=folder, env=env)  # (nothing listens on port 1)
    assert missing.returncode == 2 and missing.stderr == (
        f"aclserve {command[0]}: error: SSL_CERT_FILE {folder / 'gone.pem'} cannot be read (No such file or "
        "directory): set it to a PEM file of the CA certificates to trust, or unset it\n"), missing.stderr
    assert plain.returncode == 1 and "cannot reach http://127.0.0.1:1: Connection refused" in plain.stderr


@pytest.mark.parametrize("how", ["refused", "not trusted"])
def test_profile_says_a_failed_connection_in_infer_s_words(mtls, how):
    """`profile --url` said aiohttp's: "Cannot connect to host 127.0.0.1:1 ssl:default [Connect call
    failed ('127.0.0.1', 1)]" for an http:// URL, and an SSL error's repr, "ssl:True
    [SSLCertVerificationError: (1, '[SSL: ...", cut inside by the hint (a tester, t86)."""
    folder, url, env = mtls
    if how == "refused":
        url = "http://127.0.0.1:1"  # (nothing listens on port 1)
    else:
        env = {k: v for k, v in env.items() if k != "SSL_CERT_FILE"}
    infer = _aclserve("infer", "digits", "-i", "x=x.npy", "--url", url, cwd=folder, env=env)
    profile = _aclserve("profile", "digits", "--seconds", "0.5", "--url", url, cwd=folder, env=env)
    said = infer.stderr.removeprefix("aclserve infer: error: ")
    assert infer.returncode == profile.returncode == 1 and said.startswith(f"cannot reach {url}: "), infer.stderr
    assert profile.stderr == f"aclserve profile: error: {said}" and said.count("\n") == 1, profile.stderr
    assert "ssl:" not in said and "Errno" not in said, said
