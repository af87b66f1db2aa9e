"""A version unloaded through the repository API that its version policy no longer selects once
its model is loaded again is told as any unselected version: the index says "not selected by the
version policy", a request pinned to it a 404 (gRPC NOT_FOUND) naming the policy, its readiness
false. It stayed UNAVAILABLE "unloaded" and was answered 503 with Retry-After for good, a retry
loop for a client (a tester's find): after the policy changed while the model was unloaded, after
a newer version arrived meanwhile, and after an unload that stopped a newer version's compile.
Real server on a real port (HTTP and gRPC), real CPU OMs and an .onnx compiled by the server."""
from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from aclserve.repository.compiler import cache_key
from tests.repository.repo_helpers import place, write_in
from tests.server.test_compile_lock_wait import WAITING, holding
from tests.serving import ServerThread, free_port, in_thread, request, server_config, wait_until
from tests.tiny_models import double_onnx

NOT_SELECTED = "not selected by the version policy"
ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
HANG_GUARD_S = 60


def versions(folder, om, count: int, policy: str) -> None:
    """`folder`/addk/1..count/model.om (copies of `om`) and its config.yaml with `policy`."""
    for version in range(1, count + 1):
        (folder / "addk" / str(version)).mkdir(parents=True)
        shutil.copy(om, folder / "addk" / str(version) / "model.om")
    write_in(folder / "addk" / "config.yaml", f"version_policy: {policy}\n")


def index(srv) -> dict[str, tuple[str, str]]:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return {row["version"]: (row["state"], row["reason"]) for row in json.loads(body) if row["name"] == "addk"}


def call(srv, path: str) -> tuple[int, str]:
    status, _, body = request(srv, "POST", path)
    assert status == 200, body
    return status, body.decode()


def assert_told_not_selected(srv, version: str) -> None:
    """`version` of addk is refused as a version its policy does not select, over HTTP and gRPC."""
    status, headers, body = request(srv, "POST", f"/v2/models/addk/versions/{version}/infer", data=ONE_ROW)
    said = f"model addk version {version} is not selected by its version_policy"
    assert (status, json.loads(body)) == (404, {"error": said}), (status, body)
    assert "Retry-After" not in headers
    assert request(srv, "GET", f"/v2/models/addk/versions/{version}/ready")[0] != 200
    infer = pb.ModelInferRequest(model_name="addk", model_version=version,
                                 raw_input_contents=[np.zeros((1, 16), np.float32).tobytes()])
    infer.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(infer, timeout=HANG_GUARD_S)
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.NOT_FOUND, said)
        assert stub.ModelReady(pb.ModelReadyRequest(name="addk", version=version), timeout=HANG_GUARD_S).ready is False


def serving(folder, mode: str, settle_s: float = 0.0, **overrides) -> ServerThread:
    """The server over `folder` (explicit mode loads every model at start too), its gRPC endpoint at `grpc_url`."""
    port = free_port()
    srv = ServerThread(server_config(folder, model_control_mode=mode, grpc_port=port, settle_s=settle_s,
                                     debounce_s=0.05, **overrides))
    srv.grpc_url = f"127.0.0.1:{port}"
    return srv


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_versions_a_policy_changed_while_unloaded_drops_are_not_selected(models_dir, tmp_path, mode):
    folder = tmp_path / "models"
    versions(folder, models_dir / "double.om", 4, "all")
    with serving(folder, mode) as srv:
        assert index(srv) == {v: ("READY", "") for v in "1234"}
        call(srv, "/v2/repository/models/addk/unload")
        write_in(folder / "addk" / "config.yaml", "version_policy: {latest: 1}\n")
        call(srv, "/v2/repository/models/addk/load")
        assert index(srv) == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("UNAVAILABLE", NOT_SELECTED),
                              "3": ("UNAVAILABLE", NOT_SELECTED), "4": ("READY", "")}
        for version in "123":
            assert_told_not_selected(srv, version)
        assert request(srv, "POST", "/v2/models/addk/versions/4/infer", data=ONE_ROW)[0] == 200


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_the_version_serving_before_a_newer_one_arrived_while_unloaded_is_not_selected(models_dir, tmp_path, mode):
    folder = tmp_path / "models"
    versions(folder, models_dir / "double.om", 1, "{latest: 1}")
    with serving(folder, mode) as srv:
        call(srv, "/v2/repository/models/addk/unload")
        place(str(models_dir / "double.om"), folder / "addk" / "2" / "model.om")
        call(srv, "/v2/repository/models/addk/load")
        assert index(srv) == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("READY", "")}
        assert_told_not_selected(srv, "1")


def test_the_version_serving_before_an_unload_that_stopped_a_newer_ones_compile_is_not_selected(models_dir,
                                                                                               tmp_path):
    """Poll mode: version 2's compile waits for another process's (the cache entry's lock: it
    holds still while the unload arrives), and the unload ends it; the load call loads 2."""
    folder, cache = tmp_path / "models", tmp_path / "cache"
    cache.mkdir()
    versions(folder, models_dir / "double.om", 1, "{latest: 1}")
    with serving(folder, "poll", compile_cache_dir=str(cache)) as srv:
        source = double_onnx(tmp_path / "double.onnx")
        key = cache_key(source, srv.config.model_defaults.compile, "cpu")
        with holding(cache / f".addk-{key[:32]}.om.lock"):
            place(source, folder / "addk" / "2" / "model.onnx")
            wait_until(lambda: index(srv).get("2") == ("LOADING", WAITING), "version 2 waiting for the compile")
            unload, unloaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/addk/unload"))
            unload.join(HANG_GUARD_S)
            assert unloaded and unloaded[0][0] == 200, unloaded
            assert index(srv)["2"] == ("UNAVAILABLE", "unloaded")
        call(srv, "/v2/repository/models/addk/load")
        assert index(srv) == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("READY", "")}
        assert_told_not_selected(srv, "1")
