"""TLS on both endpoints (server/tls.py), with a test certificate authority (trustme): HTTPS
infer answered by the connection guard and by aiohttp alike, a plain request to the TLS port
refused, gRPC over TLS (tritonclient and the health service), and the configuration errors that
stop a start with one line."""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import ssl
import subprocess
import sys
import time

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import trustme

from aclserve.config import ConfigError
from aclserve.server import connections
from aclserve.server.auth import Access
from aclserve.server.grpc_health import SERVING, HealthCheckRequest, HealthCheckResponse

from tests import REPO
from tests.processes import leashed_run
from tests.serving import ServerThread, free_port

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


def loop_runner(name: str):
    """asyncio.run, or uvloop.run as `aclserve serve` runs: the guard starts TLS on each itself."""
    return asyncio.run if name == "asyncio" else pytest.importorskip("uvloop").run


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def tls_server(models_dir, make_config, authority, tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("tls_models")
    shutil.copy(models_dir / "double.om", folder / "double.om")
    _, cert, key = authority
    config = make_config(folder, grpc_port=free_port(), model_control_mode="none",
                         tls_cert_file=str(cert), tls_key_file=str(key))
    with ServerThread(config, run=loop_runner(request.param)) as server:
        server.grpc_url = f"127.0.0.1:{config.grpc_port}"
        yield server


def test_https_infer_through_the_guard_and_through_aiohttp(tls_server, authority):
    ca = authority[0]
    context = ssl.create_default_context()
    ca.configure_trust(context)

    async def scenario():
        async with aiohttp.ClientSession() as session:
            url = f"https://{tls_server.url}/v2/models/double"
            async with session.post(f"{url}/infer", data=json.dumps(BODY), ssl=context,
                                    headers={"Content-Type": "application/json"}, skip_auto_headers=["Accept-Encoding"]) as r:
                plain = r.status, await r.json()
            async with session.post(f"{url}/infer", json=BODY, ssl=context) as r:  # Accept-Encoding: aiohttp's path
                compressed = r.status, await r.json()
            async with session.get(url, ssl=context) as r:
                metadata = r.status, await r.json()
            return plain, compressed, metadata
    plain, compressed, metadata = asyncio.run(scenario())
    for status, doc in (plain, compressed):
        assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 16
    assert metadata[0] == 200 and metadata[1]["name"] == "double"


def test_a_plain_http_request_to_the_tls_port_gets_no_answer_and_is_counted(tls_server, authority):
    """Refused by TLS itself, it left no trace an operator could see (nor did a missing or bad
    client certificate): aclserve_tls_handshakes_refused_total counts them."""
    context = ssl.create_default_context()
    authority[0].configure_trust(context)

    async def refused() -> float:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://{tls_server.url}/metrics", ssl=context) as r:
                text = await r.text()
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("aclserve_tls_handshakes_refused_total ")))

    async def scenario():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.post(f"http://{tls_server.url}/v2/models/double/infer", json=BODY) as r:
                    await r.read()
    before = asyncio.run(refused())
    asyncio.run(scenario())
    for _ in range(300):  # a hang guard: counted when the server's handshake fails, after the client gave up
        if asyncio.run(refused()) == before + 1:
            break
        time.sleep(0.1)
    assert asyncio.run(refused()) == before + 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_tls_handshake_counts_against_max_connections(models_dir, make_config, authority, tmp_path, loop):
    """Connections that never send their TLS hello take the places of max_connections (timed as
    heads): one more is closed at once (no answer in the clear), and once they have waited
    EVICT_AFTER_S a real client evicts one of them and is answered. One that leaves in its
    handshake is forgotten (no handshake timeout waited for)."""
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    _, cert, key = authority
    config = make_config(tmp_path, model_control_mode="none", max_connections=2, header_timeout_s=60,
                         tls_cert_file=str(cert), tls_key_file=str(key))
    context = ssl.create_default_context()
    authority[0].configure_trust(context)
    with ServerThread(config, run=loop_runner(loop)) as server:
        host, port = server.url.rsplit(":", 1)
        stalled = [socket.create_connection((host, port)) for _ in range(2)]
        try:
            third = socket.create_connection((host, port))
            third.settimeout(20)  # without the count it would wait for the 60 s handshake timeout
            with third:
                try:
                    assert third.recv(1) == b""
                except ConnectionResetError:  # its hello unread when closed: reset, as good
                    pass
            # the third was refused as the server held both: their clocks started before we saw
            # it closed, so from here they have waited EVICT_AFTER_S, however slow the machine
            time.sleep(connections.EVICT_AFTER_S)

            async def infer():
                async with aiohttp.ClientSession() as session:
                    async with session.post(f"https://{server.url}/v2/models/double/infer", json=BODY,
                                            ssl=context) as r:
                        answer = r.status, await r.json()
                    async with session.get(f"https://{server.url}/metrics", ssl=context) as r:
                        return answer, await r.text()
            (status, doc), metrics = asyncio.run(infer())
            assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 16
            assert 'aclserve_connections_closed_total{reason="refused"} 1.0' in metrics
            assert 'aclserve_connections_closed_total{reason="evicted"} 1.0' in metrics
        finally:
            for sock in stalled:
                sock.close()

        async def open_connections():
            async with aiohttp.ClientSession() as session:
                for _ in range(100):
                    async with session.get(f"https://{server.url}/metrics", ssl=context) as r:
                        if '\naclserve_connections{transport="http"} 1.0\n' in await r.text():  # this client's alone
                            return True
                    await asyncio.sleep(0.1)
            return False
        assert asyncio.run(open_connections())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_handshake_that_does_not_come_is_a_header_timeout(models_dir, make_config, authority, tmp_path, loop):
    """A client silent after connecting to the TLS port is closed after header_timeout_s, by
    the sweep, which counts it (asyncio's own handshake timer, firing first, counted nothing)."""
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    _, cert, key = authority
    config = make_config(tmp_path, model_control_mode="none", header_timeout_s=0.5,
                         tls_cert_file=str(cert), tls_key_file=str(key))
    context = ssl.create_default_context()
    authority[0].configure_trust(context)
    with ServerThread(config, run=loop_runner(loop)) as server:
        host, port = server.url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as silent:
            silent.settimeout(30)  # a hang guard
            try:
                assert silent.recv(1) == b""
            except ConnectionResetError:
                pass

        async def scrape():
            async with aiohttp.ClientSession() as session:
                async with session.get(f"https://{server.url}/metrics", ssl=context) as r:
                    return await r.text()
        assert 'aclserve_connections_closed_total{reason="header_timeout"} 1.0' in asyncio.run(scrape())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_clients_gone_before_their_hello_leave_nothing_behind(models_dir, make_config, authority, tmp_path, loop):
    """uvloop's start_tls hands back a transport, closing already, for a client that connected
    and closed without a byte, and no connection_lost follows: each such connection stayed
    counted and aiohttp kept a handler for it, 51 KB for good (found by a helper's leak hunt)."""
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    ca, cert, key = authority
    config = make_config(tmp_path, model_control_mode="none", keepalive_timeout_s=600,  # no sweep meanwhile
                         tls_cert_file=str(cert), tls_key_file=str(key))
    context = ssl.create_default_context()
    ca.configure_trust(context)

    async def connections() -> float:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://{server.url}/metrics", ssl=context) as r:
                text = await r.text()
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith('aclserve_connections{transport="http"} ')))

    with ServerThread(config, run=loop_runner(loop)) as server:
        host, port = server.url.rsplit(":", 1)
        for _ in range(50):
            socket.create_connection((host, int(port))).close()
        for _ in range(600):  # a hang guard: they go as soon as the loop hears of them
            if asyncio.run(connections()) <= 1:  # (the scrape's own)
                break
            time.sleep(0.1)
        assert asyncio.run(connections()) <= 1


def _established(port: int) -> int:
    """Server-side TCP connections of `port` still established (/proc/net/tcp, IPv4)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[1].endswith(f":{port:04X}") and row[3] == "01")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_tls_connection_the_server_closes_lets_its_socket_go_soon(models_dir, make_config, authority, tmp_path, loop):
    """Closed for idling, a TLS connection whose client never answers the close_notify kept its
    socket for asyncio's 30 s, outside max_connections, once the tracker had let it go (found by
    a differential fuzz of TLS against plain HTTP): now guard.TLS_SHUTDOWN_S."""
    if loop == "asyncio" and sys.version_info < (3, 11):
        pytest.skip("asyncio's start_tls takes ssl_shutdown_timeout from Python 3.11")
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    ca, cert, key = authority
    config = make_config(tmp_path, model_control_mode="none", keepalive_timeout_s=0.3,
                         tls_cert_file=str(cert), tls_key_file=str(key))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with ServerThread(config, run=loop_runner(loop)) as server:
        host, port = server.url.rsplit(":", 1)
        clients = [context.wrap_socket(socket.create_connection((host, int(port))), server_hostname=host)
                   for _ in range(5)]  # handshakes done, then silent: nothing read, nothing sent
        try:
            assert _established(int(port)) >= 5
            for _ in range(200):  # the sweep closes them after 0.3 s idle; each waits 1 s for its client
                if _established(int(port)) == 0:
                    break
                time.sleep(0.1)
            assert _established(int(port)) == 0  # (20 s at most here: they were held 30 s)
        finally:
            for client in clients:
                client.close()


def test_grpc_over_tls(tls_server, authority):
    _, cert, _ = authority
    ca_file = cert.parent / "ca.pem"
    client = grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=str(ca_file))
    try:
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        result = client.infer("double", [x])
        np.testing.assert_array_equal(result.as_numpy(result.get_response().outputs[0].name), np.full((1, 16), 2.0))
    finally:
        client.close()
    credentials = grpc.ssl_channel_credentials(ca_file.read_bytes())
    with grpc.secure_channel(tls_server.grpc_url, credentials) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", HealthCheckRequest.SerializeToString,
                                    HealthCheckResponse.FromString)
        assert check(HealthCheckRequest(), timeout=60).status == SERVING
    with grpc.insecure_channel(tls_server.grpc_url) as channel:  # plain text to the TLS port
        check = channel.unary_unary("/grpc.health.v1.Health/Check", HealthCheckRequest.SerializeToString,
                                    HealthCheckResponse.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            check(HealthCheckRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_needs_both_files(make_config, tmp_path, authority):
    with pytest.raises(ConfigError, match="needs both tls_cert_file and tls_key_file"):
        make_config(tmp_path, tls_cert_file=str(authority[1]))


@pytest.mark.parametrize("which", ["missing", "mismatched", "encrypted", "not PEM", "empty key", "key not PEM"])
@pytest.mark.parametrize("grpc_port", [0, -1], ids=["http only", "with grpc"])
def test_a_certificate_that_cannot_be_used_stops_the_start_with_one_line(tmp_path, authority, which, grpc_port):
    """An encrypted key made OpenSSL ask for its passphrase on the terminal, and a file that is
    not PEM was called a mismatched pair (found by an independent review)."""
    _, cert, key = authority
    cert_file, key_file = cert, key
    if which == "missing":
        cert_file, expected = tmp_path / "nope.pem", "cannot read"
    elif which == "mismatched":
        other = trustme.CA().issue_cert("127.0.0.1")
        other.private_key_pem.write_to_path(str(tmp_path / "other.pem"))
        key_file, expected = tmp_path / "other.pem", "is not the key of the certificate"
    elif which == "encrypted":
        key_file, expected = tmp_path / "encrypted.pem", "is encrypted"
        from cryptography.hazmat.primitives import serialization  # trustme's own dependency
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
        key_file.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.BestAvailableEncryption(b"passphrase")))
    elif which == "not PEM":
        (tmp_path / "garbage.pem").write_bytes(b"not a certificate")
        cert_file, expected = tmp_path / "garbage.pem", "must be a PEM certificate chain"
    else:  # (each was said under tls_cert_file, the pair's "PEM lib": a tester)
        key_file = tmp_path / "key.pem"
        key_file.write_bytes(b"\n" if which == "empty key" else cert.read_bytes())
        expected = f"tls_key_file: {key_file} " + ("is empty: it must be a PEM private key" if which == "empty key"
                                                   else "must be a PEM private key: it holds no PRIVATE KEY block")
    port = free_port() if grpc_port else 0
    proc = leashed_run([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path), "--port", "0",
                        "--grpc-port", str(port), "--device", "cpu", "--tls-cert", str(cert_file),
                        "--tls-key", str(key_file)], cwd=REPO, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "ACL runtime" not in proc.stderr  # refused before anything started


@pytest.mark.parametrize("given", ["file", "flags"])
def test_a_file_that_cannot_be_read_is_blamed_where_it_was_given(tmp_path, authority, given):
    """Read as the server starts, not by the config loader, it said "bad configuration:
    tls_cert_file: cannot read ..." without the config file it came from (an independent
    tester): now as the loader says its own, after the file, or `command line` for a flag's."""
    (tmp_path / "models").mkdir()
    missing = tmp_path / "nope.pem"
    config = tmp_path / "c.yaml"
    config.write_text(f"port: 0\ngrpc_port: 0\ntls_cert_file: {missing}\ntls_key_file: {authority[2]}\n"
                      if given == "file" else "port: 0\ngrpc_port: 0\n")
    flags = ["--tls-cert", str(missing), "--tls-key", str(authority[2])] if given == "flags" else []
    proc = leashed_run([sys.executable, "-m", "aclserve", "serve", "--config", str(config), "--device", "cpu",
                        *flags], cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    source = config if given == "file" else "command line"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: bad configuration: {source}: tls_cert_file: cannot read {missing}" in proc.stderr, proc.stderr


def test_a_token_served_in_the_clear_beyond_loopback_is_warned_about(make_config, tmp_path, authority, caplog):
    caplog.set_level(logging.WARNING, "aclserve")
    Access(make_config(tmp_path, host="0.0.0.0", api_token="secret")).log_startup()
    assert "without TLS: the API token crosses the network in the clear" in caplog.text
    caplog.clear()
    Access(make_config(tmp_path, host="0.0.0.0", api_token="secret", tls_cert_file=str(authority[1]),
                       tls_key_file=str(authority[2]))).log_startup()
    Access(make_config(tmp_path, api_token="secret")).log_startup()  # loopback
    assert "in the clear" not in caplog.text


def test_a_certificate_out_of_its_dates_is_warned_of(tmp_path, caplog):
    """Served all the same, but said at start: every verifying client would refuse it."""
    import datetime

    from aclserve.server import tls
    ca = trustme.CA()
    past = ca.issue_cert("127.0.0.1", not_after=datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc))
    current = ca.issue_cert("127.0.0.1")
    for name, cert in (("past", past), ("current", current)):
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.pem"))
    caplog.set_level(logging.WARNING, logger="aclserve.server.tls")
    assert tls._warn_if_out_of_date(str(tmp_path / "past.pem")).startswith("expired on Jan  2 ")
    assert "clients that verify it refuse every connection" in caplog.text
    assert tls._warn_if_out_of_date(str(tmp_path / "current.pem")) is None
    assert tls._warn_if_out_of_date(str(tmp_path / "current.pem"), now=0.0).startswith("is not valid before")
