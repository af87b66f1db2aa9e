"""A JPEG or PNG file sent as the bytes of a tensor input that is not an image input
(server/stray_pictures.py): an AIPP OM without image settings takes UINT8 [-1, 16, 16, 3]. A PNG
padded with a text chunk to its 768 bytes, sent as the whole raw body, answered 200 with the
file's bytes read as pixels, and at any other size "raw binary body of N bytes does not fit ..."
(an independent tester); a JSON BYTES element already got the hint to declare an image input.
Real requests to a real server, over HTTP (raw body, binary extension) and gRPC
(raw_input_contents); tensors that only begin like a picture are served."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpc_client
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from aclserve.om import aipp
from tests.images.images_data import _chunk, encode, gradient
from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import MEAN, STD, compile_cpu_om, conv_onnx

ROW = (16, 16, 3)  # the AIPP OM's input, batch aside
ROW_BYTES = 16 * 16 * 3
HINT = "(it is not an image input: declare it an image input in the model's YAML to send images)"
RAW_HEADER = {"Inference-Header-Content-Length": "0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    onnx_path = conv_onnx(tmp_path_factory.mktemp("src") / "conv.onnx")
    ops = [aipp.generate("rgb", ",".join(map(str, MEAN)), ",".join(map(str, STD)))]
    compile_cpu_om(onnx_path, root / "conv_aipp.om", batch="1,2", aipp=ops)  # no YAML: a plain UINT8 tensor
    with ServerThread(server_config(root, grpc_port=free_port())) as srv:
        yield srv


def padded_png(size: int) -> bytes:
    """A small PNG grown to `size` bytes by a tEXt chunk before its end, as the tester made it."""
    png = encode(gradient(4, 4))
    end = png.rindex(b"IEND") - 4  # the IEND chunk's length field
    text = b"pad\0" + b"x" * (size - len(png) - 12 - 4)
    padded = png[:end] + _chunk(b"tEXt", text) + png[end:]
    assert len(padded) == size
    return padded


def pictures() -> dict[str, bytes]:
    return {"PNG of the input's size": padded_png(ROW_BYTES), "PNG": encode(gradient(10, 12)),
            "JPEG": encode(gradient(40, 40), "JPEG")}


def refused(kind: str, what: str) -> str:
    return f"input 'x': {what} is a {kind.split()[0]} file, not UINT8 [-1, 16, 16, 3] tensor data {HINT}"


def infer_raw(server, body: bytes) -> tuple[int, bytes]:
    status, _, raw = request(server, "POST", "/v2/models/conv_aipp/infer", data=body, headers=RAW_HEADER)
    return status, raw


def test_a_picture_sent_as_the_raw_body_is_refused_with_the_image_input_hint(server):
    for kind, picture in pictures().items():
        status, raw = infer_raw(server, picture)
        assert status == 400, (kind, raw)
        assert json.loads(raw)["error"] == refused(kind, "the raw binary body"), kind


def test_a_picture_sent_as_binary_tensor_data_is_refused_over_http_and_grpc(server):
    grpc_url = f"127.0.0.1:{server.config.grpc_port}"
    with http.InferenceServerClient(server.url) as h, grpc_client.InferenceServerClient(grpc_url) as g:
        for kind, picture in pictures().items():
            values = np.frombuffer(picture, np.uint8)
            fits = values.size == ROW_BYTES
            shape = [1, *ROW] if fits else [1, values.size]
            tensor = http.InferInput("x", shape, "UINT8")
            tensor.set_data_from_numpy(values.reshape(shape), binary_data=True)
            with pytest.raises(InferenceServerException) as e:
                h.infer("conv_aipp", [tensor])
            if fits:  # (a shape that does not fit is refused for its shape first, as before)
                assert refused(kind, "its binary data") in str(e.value), kind
                tensor = grpc_client.InferInput("x", shape, "UINT8")
                tensor.set_data_from_numpy(values.reshape(shape))  # raw_input_contents
                with pytest.raises(InferenceServerException, match="raw_input_contents") as e:
                    g.infer("conv_aipp", [tensor])
                assert refused(kind, "raw_input_contents[0]") in str(e.value), kind
    # binary data of another size than its shape's: said what it is (it was "binary_data_size ... does not match")
    png = pictures()["PNG"]
    head = json.dumps({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, *ROW],
                                   "parameters": {"binary_data_size": len(png)}}]}).encode()
    status, _, raw = request(server, "POST", "/v2/models/conv_aipp/infer", data=head + png,
                             headers={"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and json.loads(raw)["error"] == refused("PNG", "its binary data")


def test_tensors_that_only_begin_like_a_picture_are_served(server):
    """JPEG's FF D8 FF is also a pixel (255, 216, 255): a tensor is taken for a JPEG only when a
    JPEG header reads from there; PNG's 8-byte signature is no tensor's by chance."""
    rng = np.random.default_rng(0)
    pink = rng.integers(0, 256, ROW, dtype=np.uint8)
    pink[0, 0] = (255, 216, 255)
    jfif_start = rng.integers(0, 256, ROW, dtype=np.uint8)  # a JPEG's first 20 bytes, then pixels
    jfif_start.reshape(-1)[:20] = np.frombuffer(pictures()["JPEG"][:20], np.uint8)
    assert jfif_start.tobytes()[:4] == b"\xff\xd8\xff\xe0"
    for values in (pink, jfif_start):
        status, raw = infer_raw(server, values.tobytes())
        assert status == 200, raw
        body = {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, *ROW],
                            "parameters": {"binary_data_size": ROW_BYTES}}]}
        head = json.dumps(body).encode()
        status, _, raw = request(server, "POST", "/v2/models/conv_aipp/infer", data=head + values.tobytes(),
                                 headers={"Inference-Header-Content-Length": str(len(head))})
        assert status == 200, raw
