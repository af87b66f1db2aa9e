"""The repository index lists the models folder as it is when asked, in explicit and none modes
too, as Triton's does (ModelRepositoryManager::RepositoryIndex reads the folder on every call): a
model copied in after the start was missing from it until a load call read the folder (a tester
with tritonclient). What the index finds is listed, not loaded: UNAVAILABLE "not loaded", nothing
compiled, requests for it 404 until a load call names it. A loaded model whose file is removed
serves on, READY, as before (these modes change what serves only through load and unload calls).
Real server on a real port, tritonclient over HTTP and gRPC, real CPU runtime."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import affine_onnx


def http_rows(client) -> dict:
    return {(r["name"], r["version"]): (r["state"], r["reason"]) for r in client.get_model_repository_index()}


def grpc_rows(client) -> dict:
    return {(m.name, m.version): (m.state, m.reason) for m in client.get_model_repository_index().models}


@pytest.mark.parametrize("mode", ["explicit", "none"])
def test_a_model_copied_in_after_the_start_is_listed_not_loaded(models_dir, tmp_path, mode):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(models_dir / "double.om", folder / "double.om")
    onnx = affine_onnx(tmp_path / "affine.onnx")  # (an .onnx: a load would compile it)
    with ServerThread(server_config(folder, model_control_mode=mode, grpc_port=free_port())) as srv:
        http = httpclient.InferenceServerClient(srv.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
        try:
            assert http_rows(http) == {("double", "1"): ("READY", "")}
            shutil.copyfile(onnx, folder / "later.onnx")
            listed = {("double", "1"): ("READY", ""), ("later", "1"): ("UNAVAILABLE", "not loaded")}
            assert http_rows(http) == listed
            assert grpc_rows(grpc) == listed
            assert http_rows(http) == listed  # (read again: nothing was loaded meanwhile)
            status, _, body = request(srv, "POST", "/v2/models/later/infer", json={"inputs": []})
            assert status == 404 and "is not loaded" in json.loads(body)["error"], body
            assert not (folder / ".cache").exists()  # nothing compiled
            (folder / "later.onnx").unlink()
            (folder / "double.om").unlink()
            assert http_rows(http) == {("double", "1"): ("READY", "")}  # (what serves serves on)
            x = httpclient.InferInput("x", [1, 16], "FP32")
            x.set_data_from_numpy(np.ones((1, 16), np.float32))
            assert http.infer("double", [x]).as_numpy("y").tolist() == [[2.0] * 16]
        finally:
            http.close()
            grpc.close()
