"""TLS files renewed while the server runs (server/tls_renewal.py), laid out as the kubelet lays out a
mounted Secret: the new pair is served to new connections of both endpoints without a restart (an
established one keeps its own), a renewal that cannot be used keeps the served pair with one
WARNING, and /metrics shows the served certificate's notAfter. The server read its files once, at
start: a certificate renewed by cert-manager was served only after the pods restarted."""
from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import shutil
import socket
import ssl
import time
import urllib.request
from typing import NamedTuple

import grpc
import pytest

from aclserve.server import tls_renewal
from aclserve.server.grpc_health import SERVING, HealthCheckRequest, HealthCheckResponse
from aclserve.server.tls_renewal import ServedCertificate

from tests import REPO
from tests.serving import ServerThread, free_port

trustme = pytest.importorskip("trustme")
x509 = pytest.importorskip("cryptography.x509")  # (trustme's own dependency)

LOGGER = "aclserve.server.tls_renewal"
DAY = datetime.timedelta(days=1)
SECONDS_A_DAY = 86400.0


class Issued(NamedTuple):
    chain: bytes
    key: bytes
    der: bytes  # the leaf certificate, as a client reads it (getpeercert(binary_form=True))
    ca: bytes  # its CA's certificate, PEM
    not_after: float


def issued(ca, days: float, starts_in_days: float = -1) -> Issued:
    now = datetime.datetime.now(datetime.timezone.utc)
    leaf = ca.issue_cert("127.0.0.1", not_before=now + starts_in_days * DAY, not_after=now + days * DAY)
    pem = leaf.cert_chain_pems[0].bytes()
    not_after = x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    return Issued(b"".join(part.bytes() for part in leaf.cert_chain_pems), leaf.private_key_pem.bytes(),
                  ssl.PEM_cert_to_DER_cert(pem.decode()), ca.cert_pem.bytes(), not_after)


class SecretVolume:
    """tls.crt, tls.key (and ca.crt) as links through `..data`, itself a link to a folder of the
    files: an update writes a new folder and renames a new link over `..data`, all changed at once."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        self.cert, self.key, self.ca = root / "tls.crt", root / "tls.key", root / "ca.crt"
        self._updates = 0

    def write(self, chain: bytes, key: bytes, ca: bytes | None = None) -> None:
        self._updates += 1
        folder = self.root / f"..2026_01_01_00_00_{self._updates:02d}"
        folder.mkdir()
        (folder / "tls.crt").write_bytes(chain)
        (folder / "tls.key").write_bytes(key)
        if ca is not None:
            (folder / "ca.crt").write_bytes(ca)
        os.symlink(folder.name, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", self.root / "..data")
        for link in (self.cert, self.key, self.ca):
            if (folder / link.name).exists() and not link.is_symlink():
                os.symlink(f"..data/{link.name}", link)


def until(seen, what: str) -> None:
    """A hang guard, not a timing: polled until `seen()` holds, 60 s at most."""
    deadline = time.monotonic() + 60
    while not seen():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def any_certificate() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def served_der(url: str) -> bytes:
    """The certificate a new HTTPS connection is served."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        with any_certificate().wrap_socket(raw) as secure:
            return secure.getpeercert(binary_form=True)


def live(connection: ssl.SSLSocket) -> bool:
    """Whether a liveness request on `connection` is answered 200 (keep-alive)."""
    connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = connection.recv(4096)
        if not chunk:
            return False
        answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:  # (read whole: the next request's answer starts clean)
        chunk = connection.recv(4096)
        if not chunk:
            return False
        body += chunk
    return head.startswith(b"HTTP/1.1 200 ")


def https_answers(url: str, context: ssl.SSLContext) -> bool:
    """Whether a request over a new HTTPS connection made with `context` is answered (a client
    certificate refused ends the connection once TLS 1.3's handshake is done, at the first read)."""
    host, port = url.rsplit(":", 1)
    try:
        with context.wrap_socket(socket.create_connection((host, int(port)), timeout=30),
                                 server_hostname=host) as secure:
            return live(secure)
    except OSError:  # (ssl.SSLError too)
        return False


def grpc_serves(target: str, ca: bytes, client: Issued | None = None) -> bool:
    """Whether a gRPC call over a new channel trusting only `ca` (showing `client`) is answered."""
    shown = {"private_key": client.key, "certificate_chain": client.chain} if client is not None else {}
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(ca, **shown)) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", HealthCheckRequest.SerializeToString,
                                    HealthCheckResponse.FromString)
        try:
            return check(HealthCheckRequest(), timeout=20).status == SERVING
        except grpc.RpcError:
            return False


def expiry(url: str) -> float:
    with urllib.request.urlopen(f"https://{url}/metrics", context=any_certificate(), timeout=30) as r:
        text = r.read().decode()
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith(f"{tls_renewal.EXPIRY_METRIC} ")))


def loop_runner(name: str):
    """asyncio.run, or uvloop.run as `aclserve serve` runs."""
    return asyncio.run if name == "asyncio" else pytest.importorskip("uvloop").run


@pytest.fixture
def volume(tmp_path, monkeypatch):
    monkeypatch.setattr(tls_renewal, "POLL_S", 0.05)
    return SecretVolume(tmp_path / "secret")


def tls_config(make_config, models_dir, tmp_path, volume, **overrides):
    (tmp_path / "models").mkdir()
    shutil.copy(models_dir / "double.om", tmp_path / "models" / "double.om")
    return make_config(tmp_path / "models", grpc_port=free_port(), model_control_mode="none",
                       tls_cert_file=str(volume.cert), tls_key_file=str(volume.key), **overrides)


def said(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_renewed_pair_is_served_to_new_connections_of_both_endpoints(models_dir, make_config, tmp_path, volume,
                                                                       caplog, loop):
    caplog.set_level(logging.INFO, LOGGER)
    a, b = issued(trustme.CA(), 60), issued(trustme.CA(), 90)
    volume.write(a.chain, a.key)
    config = tls_config(make_config, models_dir, tmp_path, volume, keepalive_timeout_s=600)  # (none closed idle)
    with ServerThread(config, run=loop_runner(loop)) as server:
        target = f"127.0.0.1:{config.grpc_port}"
        assert served_der(server.url) == a.der and grpc_serves(target, a.ca)
        assert expiry(server.url) == a.not_after
        host, port = server.url.rsplit(":", 1)
        trusts_a = ssl.create_default_context(cadata=a.ca.decode())
        established = trusts_a.wrap_socket(socket.create_connection((host, int(port)), timeout=30),
                                           server_hostname=host)
        try:
            assert live(established)  # (idle between requests from here: keepalive_timeout_s)
            volume.write(b.chain, b.key)
            until(lambda: served_der(server.url) == b.der, "a new HTTPS connection was not served the renewal")
            until(lambda: grpc_serves(target, b.ca), "a gRPC channel trusting the renewal's CA alone was refused")
            assert expiry(server.url) == b.not_after
            assert live(established)  # still served, with its own pair
            assert established.getpeercert(binary_form=True) == a.der
        finally:
            established.close()
    taken = said(caplog, logging.INFO)
    assert len(taken) == 1 and taken[0].startswith("TLS certificate renewed: new connections of both endpoints are "
                                                   "served O=trustme"), taken
    assert taken[0].endswith(f" (IP Address:127.0.0.1), valid until {_openssl_date(b)} (established ones keep the "
                             f"certificate they were served)"), taken
    assert said(caplog, logging.WARNING) == []
    row = f"| `{tls_renewal.EXPIRY_METRIC}` | gauge |  | {tls_renewal.EXPIRY_HELP}"
    assert row in (REPO / "README.md").read_text(encoding="utf-8")  # README's table of every family


def test_renewed_client_cas_are_taken_by_both_endpoints(models_dir, make_config, tmp_path, volume):
    """tls_client_ca_file renewed (a client CA replaced): clients its new CA signed are served, on
    both endpoints, without a restart; those of the CA it replaced are refused."""
    server_ca, old_ca, new_ca = trustme.CA(), trustme.CA(), trustme.CA()
    pair, old_client, new_client = issued(server_ca, 60), issued(old_ca, 60), issued(new_ca, 60)
    volume.write(pair.chain, pair.key, old_ca.cert_pem.bytes())
    config = tls_config(make_config, models_dir, tmp_path, volume, tls_client_ca_file=str(volume.ca))
    shown = {}
    for name, client in (("old", old_client), ("new", new_client)):
        (tmp_path / f"{name}.pem").write_bytes(client.chain + client.key)
        shown[name] = ssl.create_default_context(cadata=pair.ca.decode())
        shown[name].load_cert_chain(str(tmp_path / f"{name}.pem"))
    with ServerThread(config) as server:
        target = f"127.0.0.1:{config.grpc_port}"
        assert https_answers(server.url, shown["old"]) and grpc_serves(target, pair.ca, old_client)
        assert not https_answers(server.url, shown["new"])
        volume.write(pair.chain, pair.key, new_ca.cert_pem.bytes())
        until(lambda: https_answers(server.url, shown["new"]), "HTTPS refused a client of the new CA")
        until(lambda: grpc_serves(target, pair.ca, new_client), "gRPC refused a client of the new CA")
        assert not https_answers(server.url, shown["old"]) and not grpc_serves(target, pair.ca, old_client)


BROKEN = {
    "key not the certificate's": (lambda a, b, old: (b.chain, a.key), "is not the key of the certificate"),
    "half-written": (lambda a, b, old: (b.chain[:len(b.chain) // 2], b.key), "must be a PEM certificate chain"),
    "expired": (lambda a, b, old: (old.chain, old.key), "expired on "),
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_renewal_that_cannot_be_used_keeps_the_pair_served_and_is_said_once(models_dir, make_config, tmp_path,
                                                                              volume, caplog, monkeypatch, broken):
    caplog.set_level(logging.INFO, LOGGER)
    polls = []
    check = ServedCertificate.check

    def counted(self, now=None):
        check(self, now)
        polls.append(None)
    monkeypatch.setattr(ServedCertificate, "check", counted)
    ca = trustme.CA()
    a, b, old = issued(ca, 60), issued(trustme.CA(), 90), issued(ca, -1, starts_in_days=-30)
    volume.write(a.chain, a.key)
    config = tls_config(make_config, models_dir, tmp_path, volume)
    make, why = BROKEN[broken]
    with ServerThread(config) as server:
        volume.write(*make(a, b, old))
        until(lambda: said(caplog, logging.WARNING), "the renewal's refusal was not said")
        after = len(polls)
        until(lambda: len(polls) >= after + 5, "the files were not polled again")
        assert served_der(server.url) == a.der and grpc_serves(f"127.0.0.1:{config.grpc_port}", a.ca)
    refused = said(caplog, logging.WARNING)
    assert len(refused) == 1 and refused[0].startswith("the TLS files changed but are not taken: "), refused
    assert why in refused[0] and refused[0].endswith(f" (IP Address:127.0.0.1), valid until {_openssl_date(a)} "
                                                     f"until they are mended"), refused
    assert said(caplog, logging.INFO) == []


def _openssl_date(pair: Issued) -> str:
    """notAfter as OpenSSL writes it (`Jan  2 00:00:00 2020 GMT`)."""
    at = time.gmtime(pair.not_after)
    return f"{time.strftime('%b', at)} {at.tm_mday:2d} {time.strftime('%H:%M:%S %Y', at)} GMT"


def test_an_expiry_within_14_days_is_warned_of_once_per_certificate(make_config, tmp_path, volume, caplog):
    """At start and at each check (on the watch's thread; called here), once a certificate, and
    once more when it has expired. cert-manager renews 30 days before the end: one this close to
    it is one whose renewal did not come."""
    ca = trustme.CA()
    soon, later = issued(ca, 5), issued(ca, 10)
    volume.write(soon.chain, soon.key)
    served = ServedCertificate(make_config(tmp_path, tls_cert_file=str(volume.cert), tls_key_file=str(volume.key)))
    caplog.set_level(logging.WARNING, LOGGER)
    served.load()
    served.check()
    served.check()
    assert said(caplog, logging.WARNING) == [f"the TLS certificate {volume.cert} expires on {_openssl_date(soon)}: "
                                             f"clients that verify it will refuse every connection then; renew its "
                                             f"files (taken as they change, no restart needed)"]
    volume.write(later.chain, later.key)
    served.check()
    served.check()
    assert len(said(caplog, logging.WARNING)) == 2 and _openssl_date(later) in said(caplog, logging.WARNING)[1]
    gone = later.not_after + 1
    served.check(now=gone)
    served.check(now=gone)
    assert said(caplog, logging.WARNING)[2:] == [f"the TLS certificate {volume.cert} expired on "
                                                 f"{_openssl_date(later)}: clients that verify it refuse every "
                                                 f"connection; renew its files (taken as they change, no restart "
                                                 f"needed)"]


def test_a_renewal_not_valid_yet_is_taken_once_it_is(make_config, tmp_path, volume, caplog):
    """Refused while its clients would refuse it (said once), read again at each check, taken once
    valid; files written again the same are no renewal."""
    ca = trustme.CA()
    current, coming = issued(ca, 60), issued(ca, 90, starts_in_days=1)
    volume.write(current.chain, current.key)
    served = ServedCertificate(make_config(tmp_path, tls_cert_file=str(volume.cert), tls_key_file=str(volume.key)))
    caplog.set_level(logging.INFO, LOGGER)
    served.load()
    volume.write(current.chain, current.key)  # (a new folder, the same files)
    served.check()
    assert said(caplog, logging.INFO) == said(caplog, logging.WARNING) == []
    volume.write(coming.chain, coming.key)
    served.check()
    served.check()
    refused = said(caplog, logging.WARNING)
    assert len(refused) == 1 and "is not valid before" in refused[0] and said(caplog, logging.INFO) == []
    assert served.families(None)[0].rows == [((), current.not_after)]
    served.check(now=time.time() + 2 * SECONDS_A_DAY)
    assert said(caplog, logging.INFO)[0].startswith("TLS certificate renewed")
    assert served.families(None)[0].rows == [((), coming.not_after)]
