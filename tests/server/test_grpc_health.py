"""grpc.health.v1.Health on the gRPC endpoint, called as Kubernetes' gRPC probes and
grpc_health_probe call it: Check of the whole server and of the inference service, an unknown
service NOT_FOUND, NOT_SERVING while strict readiness is false, and Watch's status then its end
(NOT_SERVING) when the shutdown's drain begins. The only time limits are hang guards."""
from __future__ import annotations

import shutil
import threading

import grpc
import pytest

from aclserve.server.grpc_health import (INFERENCE_SERVICE, NOT_SERVING, SERVICE_UNKNOWN, SERVING,
                                         HealthCheckRequest, HealthCheckResponse)

from tests.serving import ServerThread, free_port, started_with_grpc

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
HANG_GUARD_S = 60


def check(url: str, service: str = "", raw: bytes | None = None):
    """The status Check answers, or the RpcError it ends with."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(CHECK, request_serializer=lambda m: m if raw is not None else m.SerializeToString(),
                                   response_deserializer=HealthCheckResponse.FromString)
        try:
            return call(raw if raw is not None else HealthCheckRequest(service=service), timeout=HANG_GUARD_S).status
        except grpc.RpcError as e:
            return e


@pytest.fixture
def served(models_dir, make_config, tmp_path):
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    yield from started_with_grpc(make_config(tmp_path, grpc_port=free_port(), model_control_mode="none"))


def test_check_answers_for_the_server_and_the_inference_service(served):
    assert check(served.grpc_url) == SERVING
    assert check(served.grpc_url, INFERENCE_SERVICE) == SERVING
    unknown = check(served.grpc_url, "affine")
    assert unknown.code() == grpc.StatusCode.NOT_FOUND and "unknown service 'affine'" in unknown.details()
    garbage = check(served.grpc_url, raw=b"\xff\xff\xff")
    assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT and "not valid" in garbage.details()


def test_check_says_not_serving_while_a_model_that_should_serve_does_not(models_dir, make_config, tmp_path):
    """Strict readiness (the default): a model whose load failed keeps the server not ready."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    config = make_config(tmp_path, grpc_port=free_port(), model_control_mode="none")
    for server in started_with_grpc(config):
        assert check(server.grpc_url) == NOT_SERVING
        assert check(server.grpc_url, INFERENCE_SERVICE) == NOT_SERVING


def test_watch_sends_the_status_then_not_serving_when_the_drain_begins(served):
    with grpc.insecure_channel(served.grpc_url) as channel:
        watch = channel.unary_stream(WATCH, request_serializer=HealthCheckRequest.SerializeToString,
                                     response_deserializer=HealthCheckResponse.FromString)
        unknown = watch(HealthCheckRequest(service="nope"), timeout=HANG_GUARD_S)
        assert next(unknown).status == SERVICE_UNKNOWN  # the call stays open, as the protocol says
        unknown.cancel()
        statuses = watch(HealthCheckRequest(), timeout=HANG_GUARD_S)
        assert next(statuses).status == SERVING
        served.close()  # the drain ends the watch (it does not hold the shutdown)
        assert [answer.status for answer in statuses] == [NOT_SERVING]  # then the call ends OK
    assert served.error is None


def test_a_stalled_watch_message_ends_after_body_timeout(models_dir, make_config, tmp_path):
    """A Watch whose message never comes holds no call slot past body_timeout_s: the call's
    headers are sent and its message stalled, as grpc_intake.receive times every method."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    config = make_config(tmp_path, grpc_port=free_port(), model_control_mode="none", body_timeout_s=0.5)
    server = ServerThread(config).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}") as channel:
            # a client-streaming call on the wire: headers, then no message at all
            stalled = channel.stream_stream(WATCH, request_serializer=HealthCheckRequest.SerializeToString,
                                            response_deserializer=HealthCheckResponse.FromString)
            gone = threading.Event()

            def no_message():
                gone.wait(HANG_GUARD_S)
                yield from ()
            try:
                with pytest.raises(grpc.RpcError) as ended:
                    next(stalled(no_message(), timeout=HANG_GUARD_S))
            finally:
                gone.set()
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "body_timeout_s" in ended.value.details()
    finally:
        server.close()
