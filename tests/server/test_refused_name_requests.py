"""A request for a model whose file the repository refused for its name (`my model.om`, non-ASCII,
`?`) was answered 404 "unknown model 'my model'" with no hint; only the index said "model names use
ASCII letters..." (a tester, t68). The 404 now names the file, relative to the models folder, and
why its name is refused, over HTTP and gRPC alike. Real server on real ports, real CPU runtime."""
from __future__ import annotations

import json
import shutil
from urllib.parse import quote

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.serving import free_port, json_call, request, server_config, started_with_grpc

from .grpc_raw import INFER, affine

ASCII_ONLY = "model names use ASCII letters, digits, '_', '-', '.' (at most 128, not starting with '-' or '.')"


@pytest.fixture(scope="module")
def srv(models_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("refused_names")
    shutil.copy(models_dir / "affine.om", folder / "affine.om")
    for refused in ("my model.om", "café.om", "what?.om"):
        shutil.copy(models_dir / "affine.om", folder / refused)
    (folder / "my model.yaml").write_text("instances: 1\n")
    (folder / "two words" / "1").mkdir(parents=True)
    shutil.copy(models_dir / "affine.om", folder / "two words" / "1" / "model.om")
    yield from started_with_grpc(server_config(folder, grpc_port=free_port(), model_control_mode="none"))


def grpc_refusal(srv, name: str) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(srv.grpc_url) as channel:
        infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            infer(affine(1, model=name))
    return e.value.code(), e.value.details()


@pytest.mark.parametrize("name, files", [("my model", "my model.om and my model.yaml"), ("café", "café.om"),
                                         ("what?", "what?.om")])
def test_a_request_for_a_model_whose_file_is_refused_for_its_name_is_told_why(srv, name, files):
    said = f"unknown model {name!r}: the models folder has {files}, whose name is refused: {ASCII_ONLY}"
    path = f"/v2/models/{quote(name)}"
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]}).encode()
    answers = [json_call(srv.url, path + "/infer", body), json_call(srv.url, path + "/versions/1/infer", body),
               json_call(srv.url, path), json_call(srv.url, path + "/ready")]
    status, _, raw = request(srv, "POST", path + "/infer", data=body)  # (aiohttp's routes, not the guard's)
    answers.append((status, json.loads(raw)))
    assert answers == [(404, {"error": said})] * 5, answers
    assert grpc_refusal(srv, name) == (grpc.StatusCode.NOT_FOUND, said)
    assert str(srv.config.models_dir) not in said  # (the folder's own path is never told)


def test_a_name_without_a_refused_file_is_still_only_unknown(srv):
    """No file of the name (a refused name or a valid one; a refused file that merely starts like
    it is none): nothing to tell. A folder of a refused name was a model known by its problem
    already, told why in its 404 (so is a request naming a refused file whole, `my model.om`)."""
    for name in ("no such model", "my", "my model.o", "affin"):
        status, answer = json_call(srv.url, f"/v2/models/{quote(name)}")
        assert (status, answer) == (404, {"error": f"unknown model {name!r}"}), answer
    assert grpc_refusal(srv, "no such model") == (grpc.StatusCode.NOT_FOUND, "unknown model 'no such model'")
    status, answer = json_call(srv.url, f"/v2/models/{quote('two words')}")
    assert (status, answer) == (404, {"error": f"model two words has no available versions ({ASCII_ONLY})"}), answer
