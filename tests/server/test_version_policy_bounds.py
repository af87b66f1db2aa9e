"""A version_policy number past what its fields carry is refused as the config is read, naming the
key and the bound: `latest` past Triton's uint32 num_versions, a `specific` version past the 18
digits a version folder's name and a request's version may have. They were taken, and the
model's /config answered 500 (HTTP: orjson's "Integer exceeds 64-bit range") and gRPC ModelConfig
INTERNAL (a tester's find); the bounds themselves serve, /config showing them on both transports.
Real server on a real port, real CPU OMs."""
from __future__ import annotations

import json
import shutil

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.serving import ServerThread, free_port, request, server_config

REFUSED = {  # model -> (its version_policy, what the index says of it)
    "huge": ("{latest: 99999999999999999999999}",
             "version_policy.latest: must be <= 4294967295, got 99999999999999999999999"),
    "past_uint32": ("{latest: 4294967296}", "version_policy.latest: must be <= 4294967295, got 4294967296"),
    "past_int64": ("{specific: [1, 9223372036854775808]}",
                   "version_policy.specific[1]: must be <= 999999999999999999 (a version is named by its folder, a "
                   "positive integer of at most 18 digits), got 9223372036854775808"),
    "past_digits": ("{specific: [1, 1000000000000000000]}",
                    "version_policy.specific[1]: must be <= 999999999999999999 (a version is named by its folder, a "
                    "positive integer of at most 18 digits), got 1000000000000000000"),
}
AT_THE_BOUNDS = {"latest_max": "{latest: 4294967295}", "specific_max": "{specific: [1, 999999999999999999]}"}


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy_bounds")
    for name, policy in {**{n: p for n, (p, _) in REFUSED.items()}, **AT_THE_BOUNDS}.items():
        (folder / name / "1").mkdir(parents=True)
        shutil.copy(models_dir / "double.om", folder / name / "1" / "model.om")
        (folder / name / "config.yaml").write_text(f"version_policy: {policy}\n")
    with ServerThread(server_config(folder, grpc_port=free_port())) as server:
        server.grpc_url = f"127.0.0.1:{server.config.grpc_port}"
        yield server


def test_a_version_policy_number_past_its_bound_is_refused_naming_the_key_and_the_bound(srv):
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    rows = {row["name"]: (row["state"], row["reason"]) for row in json.loads(body)}
    for name, (_, said) in REFUSED.items():
        assert rows[name] == ("UNAVAILABLE", f"<models>/{name}/config.yaml: {said}"), rows[name]
        status, _, body = request(srv, "GET", f"/v2/models/{name}/config")
        assert status == 404 and said in json.loads(body)["error"], (status, body)
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name in REFUSED:
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelConfig(pb.ModelConfigRequest(name=name), timeout=60)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()


def test_the_bounds_themselves_serve_and_config_shows_them(srv):
    status, _, body = request(srv, "GET", "/v2/models/latest_max/config")
    assert (status, json.loads(body)["version_policy"]) == (200, {"latest": {"num_versions": 4294967295}}), body
    status, _, body = request(srv, "GET", "/v2/models/specific_max/config")
    assert (status, json.loads(body)["version_policy"]) == (
        200, {"specific": {"versions": [1, 999999999999999999]}}), body
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert client.get_model_config("latest_max").config.version_policy.latest.num_versions == 4294967295
        assert list(client.get_model_config("specific_max").config.version_policy.specific.versions) == [
            1, 999999999999999999]
    finally:
        client.close()
    assert request(srv, "GET", "/v2/models/specific_max/versions/1/ready")[0] == 200
