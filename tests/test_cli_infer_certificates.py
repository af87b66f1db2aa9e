"""`aclserve infer` (and `aclserve profile`) meeting a TLS server whose certificate it cannot
take, its CA trusted: what is wrong with the certificate is said, not "not trusted". Real server
behind TLS (trustme's certificates), CPU runtime."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np

from tests.infer_command import infer_at


def _tls_digits_server(tmp_path, **validity):
    """The digits model behind TLS with a certificate for 127.0.0.1 (`validity`: trustme's
    not_before / not_after), an x.npy for it, and the environment trusting its CA:
    (ServerThread, env)."""
    import os
    import trustme
    from tests import REPO
    from tests.serving import ServerThread, server_config
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", **validity)
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    (tmp_path / "cert.pem").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    np.save(tmp_path / "x.npy", np.ones((1, 64), np.float32))
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "ca.pem")}
    config = server_config(tmp_path / "models", model_control_mode="none", tls_cert_file=str(tmp_path / "cert.pem"),
                           tls_key_file=str(tmp_path / "key.pem"))
    return ServerThread(config), env


def test_a_certificate_for_another_host_is_said_so_not_taken_for_an_untrusted_one(tmp_path):
    """A certificate for 127.0.0.1 met at https://localhost with its CA trusted was "Hostname
    mismatch ... (the server's certificate is not trusted here: SSL_CERT_FILE=<the CA that
    signed it>)": trusting the CA was done, and would not help."""
    server, env = _tls_digits_server(tmp_path)
    with server:
        port = server.url.rsplit(":", 1)[1]
        by_address = infer_at(f"https://127.0.0.1:{port}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
        by_name = infer_at(f"https://localhost:{port}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
        profiled = subprocess.run([sys.executable, "-m", "aclserve", "profile", "digits", "--url",
                                   f"https://localhost:{port}", "--seconds", "0.5"], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
    assert by_address.returncode == 0, by_address.stderr
    said = "(the server's certificate does not name localhost, the host in the URL: use a host name or address it " \
           "was issued for)"
    for proc in (by_name, profiled):
        assert proc.returncode == 1 and proc.stderr.rstrip("\n").endswith(said), proc.stderr
        assert "not trusted" not in proc.stderr


def test_an_expired_server_certificate_is_said_so(tmp_path):
    """An expired certificate, its CA trusted, was "certificate has expired ... (the server's
    certificate is not trusted here: SSL_CERT_FILE=<the CA that signed it>)": that was done."""
    import datetime
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    server, env = _tls_digits_server(tmp_path, not_before=past, not_after=past + datetime.timedelta(days=1))
    with server:
        proc = infer_at(f"https://{server.url}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "certificate has expired" in proc.stderr, proc.stderr
    assert proc.stderr.rstrip("\n").endswith("(the server's certificate is outside its dates of validity: the server "
                                             "needs a current one, or this machine's clock is wrong)"), proc.stderr
