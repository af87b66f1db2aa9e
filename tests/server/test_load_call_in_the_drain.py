"""A repository load call that ends while the shutdown drains (an infer request still in flight
holds the drain) is answered 503 "the server is shutting down", over HTTP and gRPC: it was answered
200, and the model unloaded at once by the close that follows the drain. (One arriving in the drain
is refused before it reaches the repository.) Real server on a real port (stopped as on SIGTERM),
real CPU OMs; the infer request and the load's warm-up are held by CPU-runtime faults, let go by
the test: nothing is timed."""
from __future__ import annotations

import json
import logging
import shutil
import threading

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from aclserve.acl.cpu import faults
from tests.serving import ServerThread, free_port, in_thread, json_call, server_config, wait_until

HANG_GUARD_S = 60
ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def load_call(srv, transport: str) -> tuple:
    """A load call of m: (HTTP status, error) or (gRPC code name, details)."""
    if transport == "http":
        status, body = json_call(srv.url, "/v2/repository/models/m/load", b"{}")
        return status, (body or {}).get("error")
    with grpc.insecure_channel(srv.grpc_url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(model_name="m"), timeout=HANG_GUARD_S)
        except grpc.RpcError as e:
            return e.code().name, e.details()
    return "OK", None


def refused(transport: str) -> tuple:
    said = "the server is shutting down: m will not be served (its shutdown unloads every model)"
    return (503, said) if transport == "http" else ("UNAVAILABLE", said)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_load_ending_in_the_drain_is_answered_503(models_dir, tmp_path, clean_faults, caplog, transport):
    """Explicit mode: `a` serves; m.om comes after the start, and a load call loads it, its warm-up
    held; an infer request of `a`, held too, keeps the drain of the stop going while the warm-up ends."""
    caplog.set_level(logging.INFO, logger="aclserve")
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "a.om")
    port = free_port()
    srv = ServerThread(server_config(folder, grpc_port=port, shutdown_timeout_s=HANG_GUARD_S)).start()
    srv.grpc_url = f"127.0.0.1:{port}"
    warm_up_gate, infer_gate = threading.Event(), threading.Event()
    try:
        shutil.copy(models_dir / "double.om", folder / "m.om")
        held_warm_up = faults.inject("execute", nth=1, hold=warm_up_gate)
        load, loaded = in_thread(lambda: load_call(srv, transport))
        assert held_warm_up.entered.wait(HANG_GUARD_S)
        held_infer = faults.inject("execute", nth=1, hold=infer_gate)
        infer, inferred = in_thread(lambda: json_call(srv.url, "/v2/models/a/infer", ONE_ROW))
        assert held_infer.entered.wait(HANG_GUARD_S)
        srv.begin_close()  # as SIGTERM
        wait_until(lambda: any(m.startswith("shutting down: 1 request(s) in flight") for m in caplog.messages),
                   "the drain begun")
        warm_up_gate.set()
        load.join(HANG_GUARD_S)
        assert any(m.startswith("m: version 1 ready") for m in caplog.messages)  # it did load, in the drain
        assert loaded == [refused(transport)]
        infer_gate.set()
        infer.join(HANG_GUARD_S)
        assert inferred and inferred[0][0] == 200, inferred  # the drain served what it waited for
    finally:
        warm_up_gate.set()
        infer_gate.set()
        srv.close()
    assert srv.error is None, srv.error
