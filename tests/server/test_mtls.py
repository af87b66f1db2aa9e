"""Mutual TLS (tls_client_ca_file, server/tls.py): both endpoints ask for a client certificate
and refuse the handshake of a client that shows none, or one the configured CAs did not sign;
with one they did, HTTPS and gRPC serve as usual."""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import trustme

from aclserve.config import ConfigError

from tests import REPO
from tests.processes import leashed_run
from tests.serving import ServerThread, free_port

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Files of: the server's pair, the client CA, a client signed by it, one signed by another CA."""
    folder = tmp_path_factory.mktemp("mtls")
    server_ca, client_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1")
    files = {"server_ca": folder / "server_ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem",
             "client_ca": folder / "client_ca.pem"}
    server_ca.cert_pem.write_to_path(str(files["server_ca"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    files["cert"].write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
    client_ca.cert_pem.write_to_path(str(files["client_ca"]))
    for name, ca in (("client", client_ca), ("stranger", stranger_ca)):
        leaf = ca.issue_cert(f"{name}@example.test")
        files[f"{name}_key"] = folder / f"{name}_key.pem"
        files[f"{name}_cert"] = folder / f"{name}_cert.pem"
        leaf.private_key_pem.write_to_path(str(files[f"{name}_key"]))
        files[f"{name}_cert"].write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    return files


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def mtls_server(models_dir, make_config, pki, tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("mtls_models")
    shutil.copy(models_dir / "double.om", folder / "double.om")
    config = make_config(folder, grpc_port=free_port(), model_control_mode="none", tls_cert_file=str(pki["cert"]),
                         tls_key_file=str(pki["key"]), tls_client_ca_file=str(pki["client_ca"]))
    run = asyncio.run if request.param == "asyncio" else pytest.importorskip("uvloop").run
    with ServerThread(config, run=run) as server:
        server.grpc_url = f"127.0.0.1:{config.grpc_port}"
        yield server


def client_context(pki, who: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["server_ca"]))
    if who is not None:
        context.load_cert_chain(str(pki[f"{who}_cert"]), str(pki[f"{who}_key"]))
    return context


def https_infer(server, context) -> tuple[int, dict]:
    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.post(f"https://{server.url}/v2/models/double/infer", json=BODY, ssl=context) as r:
                return r.status, await r.json()
    return asyncio.run(scenario())


def test_https_serves_a_client_whose_certificate_the_ca_signed(mtls_server, pki):
    status, doc = https_infer(mtls_server, client_context(pki, "client"))
    assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 16


@pytest.mark.parametrize("who", [None, "stranger"], ids=["no certificate", "another CA's"])
def test_https_refuses_the_handshake_of_any_other_client(mtls_server, pki, who):
    with pytest.raises(aiohttp.ClientError):  # TLS 1.3: the alert may come with the first read
        https_infer(mtls_server, client_context(pki, who))
    status, _ = https_infer(mtls_server, client_context(pki, "client"))
    assert status == 200  # and the server serves on


def grpc_infer(server, pki, who: str | None):
    kwargs = {} if who is None else {"private_key": str(pki[f"{who}_key"]), "certificate_chain": str(pki[f"{who}_cert"])}
    client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(pki["server_ca"]),
                                              **kwargs)
    try:
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        result = client.infer("double", [x], client_timeout=30)
        return result.as_numpy(result.get_response().outputs[0].name)
    finally:
        client.close()


def test_grpc_serves_only_clients_with_a_certificate_the_ca_signed(mtls_server, pki):
    np.testing.assert_array_equal(grpc_infer(mtls_server, pki, "client"), np.full((1, 16), 2.0))
    for who in (None, "stranger"):
        with pytest.raises(Exception) as refused:  # tritonclient's InferenceServerException
            grpc_infer(mtls_server, pki, who)
        assert "UNAVAILABLE" in str(refused.value), refused.value
    credentials = grpc.ssl_channel_credentials(pki["server_ca"].read_bytes())
    with grpc.secure_channel(mtls_server.grpc_url, credentials) as channel:  # the health service too
        check = channel.unary_unary("/grpc.health.v1.Health/Check", lambda m: b"", lambda b: b)
        with pytest.raises(grpc.RpcError) as refused:
            check(b"", timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_certificates_need_tls(make_config, tmp_path, pki):
    with pytest.raises(ConfigError, match="client certificates need TLS"):
        make_config(tmp_path, tls_client_ca_file=str(pki["client_ca"]))


@pytest.mark.parametrize("which", ["missing", "not PEM"])
def test_a_client_ca_file_that_cannot_be_used_stops_the_start_with_one_line(tmp_path, pki, which):
    if which == "missing":
        ca_file, expected = tmp_path / "nope.pem", "tls_client_ca_file: cannot read"
    else:
        ca_file, expected = tmp_path / "garbage.pem", "must hold PEM CA certificates"
        ca_file.write_bytes(b"not a certificate")
    proc = leashed_run([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path), "--port", "0",
                        "--grpc-port", str(free_port()), "--device", "cpu", "--tls-cert", str(pki["cert"]),
                        "--tls-key", str(pki["key"]), "--tls-client-ca", str(ca_file)],
                       cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "ACL runtime" not in proc.stderr  # refused before anything started
