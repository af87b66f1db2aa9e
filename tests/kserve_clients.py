"""The KServe SDK's clients on a running server, in a process of their own (tests/server/test_kserve_sdk.py
runs it): the SDK imports its own generated `inference.*` protobuf messages, which cannot be
loaded into a process that already holds tritonclient's (the server's) copy of the same names.

    python tests/kserve_clients.py HTTP_URL GRPC_ADDRESS  ->  JSON: {"live", "ready", "rest_binary",
    "rest_json", "grpc"}, each answer {"id", "outputs": {name: nested list}}
"""
from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


def affine_request(binary: bool) -> InferRequest:
    x = InferInput(name="x", shape=list(X.shape), datatype="FP32")
    x.set_data_from_numpy(X, binary_data=binary)
    idx = InferInput(name="idx", shape=list(IDX.shape), datatype="INT64")
    idx.set_data_from_numpy(IDX, binary_data=binary)
    return InferRequest(model_name="affine", infer_inputs=[x, idx], request_id="kserve-1")


def answer(response) -> dict:
    return {"id": response.id, "outputs": {o.name: o.as_numpy().tolist() for o in response.outputs}}


async def main(http_url: str, grpc_address: str) -> dict:
    rest = InferenceRESTClient(RESTConfig(protocol="v2"))
    grpc = InferenceGRPCClient(grpc_address)
    try:
        return {"live": await rest.is_server_live(http_url), "ready": await rest.is_model_ready(http_url, "affine"),
                "rest_binary": answer(await rest.infer(http_url, affine_request(True), model_name="affine")),
                "rest_json": answer(await rest.infer(http_url, affine_request(False), model_name="affine")),
                "grpc": answer(await grpc.infer(affine_request(True)))}
    finally:
        await rest.close()
        await grpc.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
