"""A real server on a real port: real repository, real CPU runtime, real CPU OMs built from
tiny ONNX models (tests/tiny_models.py). The server runs its own event loop in a background
thread (tests/serving.py), so tests can use blocking clients (tritonclient) directly and
aiohttp clients under asyncio.run()."""
from __future__ import annotations

import shutil

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc as pbg

from tests import REPO
from tests.serving import ServerThread, free_port, server_config
from tests.tiny_models import affine_onnx, affine_reference, compile_cpu_om, double_onnx, kinds_onnx


@pytest.fixture(scope="session")
def make_config():
    return server_config


@pytest.fixture(scope="session")
def reference():
    return affine_reference


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """affine.om and double.om, compiled once per session."""
    root = tmp_path_factory.mktemp("server_models")
    src = tmp_path_factory.mktemp("server_src")
    compile_cpu_om(affine_onnx(src / "affine.onnx"), root / "affine.om")
    compile_cpu_om(double_onnx(src / "double.onnx"), root / "double.om")
    return root


@pytest.fixture(scope="session")
def kinds_dir(tmp_path_factory):
    """A models folder holding kinds.om alone (FP32, FP16 and BOOL outputs), compiled once per session."""
    root = tmp_path_factory.mktemp("kinds_models")
    compile_cpu_om(kinds_onnx(tmp_path_factory.mktemp("kinds_src") / "kinds.onnx"), root / "kinds.om")
    return root


@pytest.fixture
def double_dir(models_dir, tmp_path):
    """A models folder of the test's own (tmp_path / "models") holding double.om alone."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    return folder


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    """(CA, certificate file, key file) for 127.0.0.1, from a test certificate authority (trustme:
    skipped without it)."""
    trustme = pytest.importorskip("trustme")
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    with open(folder / "cert.pem", "ab") as f:
        for pem in cert.cert_chain_pems[1:]:
            f.write(pem.bytes())
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return ca, folder / "cert.pem", folder / "key.pem"


@pytest.fixture(scope="module")
def server(models_dir):
    with ServerThread(server_config(models_dir)) as srv:
        yield srv


@pytest.fixture(scope="module")
def pair(models_dir):
    """(direct_infer on, direct_infer off), same models: the guard's answers and aiohttp's."""
    with ServerThread(server_config(models_dir, model_control_mode="none")) as on, \
         ServerThread(server_config(models_dir, model_control_mode="none", direct_infer=False)) as off:
        yield on, off



@pytest.fixture(scope="module")
def traced_server(models_dir, tmp_path_factory):
    """A server with gRPC on and a trace folder of its own (its `trace_dir`), for the trace tests."""
    trace_dir = tmp_path_factory.mktemp("traces")
    with ServerThread(server_config(models_dir, grpc_port=free_port(), trace_dir=str(trace_dir))) as srv:
        srv.trace_dir = trace_dir
        yield srv


# the gRPC tests' server (test_grpc.py, test_grpc_streams.py), one per module, and its clients
@pytest.fixture(scope="module")
def grpc_models(models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_models")
    for name in ("affine", "double"):
        shutil.copy(models_dir / f"{name}.om", root / f"{name}.om")
    shutil.copy(REPO / "models" / "digits.om", root / "digits.om")
    # "slow": affine (gears 1,2,4,8) with a partial batch held for a minute: 3 or 6 queued rows
    # fill no gear, so they wait until 8 rows arrive: the test decides when a batch runs
    shutil.copy(models_dir / "affine.om", root / "slow.om")
    (root / "slow.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    shutil.copy(models_dir / "affine.om", root / "roomy.om")  # a queue for 150 calls at once
    (root / "roomy.yaml").write_text("batching: {default_queue_policy: {max_queue_size: 200}}\n")
    return root


@pytest.fixture(scope="module")
def grpc_server(grpc_models):
    with ServerThread(server_config(grpc_models, grpc_port=free_port())) as srv:
        srv.grpc_url = f"127.0.0.1:{srv.config.grpc_port}"
        yield srv


@pytest.fixture(scope="module")
def client(grpc_server):
    c = grpcclient.InferenceServerClient(grpc_server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(grpc_server):
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)
