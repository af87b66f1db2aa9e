"""A picture or a multipart form sent as an infer request's body (server/not_json.py): what a vision
client tries first (`curl --data-binary @cat.jpg`, `curl -F x=@cat.jpg`) was answered with the
JSON parser's words, "it is not UTF-8 text (binary tensor data goes after the JSON part ...)" or
"no digit after sign", which did not say how to send a picture (an independent tester). Real
requests to a real server: a small body (answered by the connection guard) and one over 64 KiB
(aiohttp's path)."""
from __future__ import annotations

import functools
import json
import os
import shutil

import aiohttp
import numpy as np
import pytest

from aclserve.runtime.types import TensorSpec
from aclserve.server.not_json import how_to_send
from tests import REPO
from tests.images.images_data import encode, gradient
from tests.serving import ServerThread, request, server_config

NOT_JSON = "request body is not valid JSON: "
RAW = ("send a picture as the whole body with the header `Inference-Header-Content-Length: 0` (curl -H "
       "'Inference-Header-Content-Length: 0' --data-binary @picture.jpg), or base64 in a JSON body (input 'x', "
       "datatype BYTES, shape [1])")
NO_PICTURES = ("this model takes no pictures (its inputs: x FP32 [-1, 64]): send a KServe v2 JSON body; an input "
               "takes JPEG or PNG files once the model's YAML declares it an image input")
FORM = "it is a multipart/form-data upload (curl -F, an HTML form), which this server does not take; "


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om", "digits.yaml"):
        shutil.copy(os.path.join(REPO, "models", name), root / name)
    with ServerThread(server_config(root)) as srv:
        yield srv


def error_of(server, model: str, **kwargs) -> str:
    status, _, raw = request(server, "POST", f"/v2/models/{model}/infer", **kwargs)
    assert status == 400, raw
    return json.loads(raw)["error"]


@functools.cache
def pictures() -> dict[str, bytes]:
    small = gradient(24, 24)
    large = np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)  # noise: over 64 KiB
    found = {"PNG": encode(small), "JPEG": encode(small, "JPEG"), "large JPEG": encode(large, "JPEG", quality=95),
             "GIF": encode(small, "GIF"), "BMP": encode(small, "BMP"), "WebP": encode(small, "WEBP")}
    assert len(found["large JPEG"]) > 64 * 1024
    return found


def test_a_picture_sent_as_the_body_is_named_and_the_raw_form_given(server):
    for kind, picture in pictures().items():
        shown = kind.removeprefix("large ")
        raw = RAW if shown in ("JPEG", "PNG") else RAW.replace("picture as", f"picture (a JPEG or PNG, not {shown}) as")
        for headers in ({}, {"Content-Type": f"image/{shown.lower()}"}):
            assert error_of(server, "digits_image", data=picture, headers=headers) == (
                f"{NOT_JSON}it is a {shown} picture; {raw}"), kind
    # what it says serves
    status, headers, _ = request(server, "POST", "/v2/models/digits_image/infer", data=pictures()["PNG"],
                                 headers={"Inference-Header-Content-Length": "0"})
    assert status == 200 and "Inference-Header-Content-Length" in headers


def test_a_picture_sent_to_a_model_without_an_image_input_is_named(server):
    assert error_of(server, "digits", data=pictures()["JPEG"]) == f"{NOT_JSON}it is a JPEG picture; {NO_PICTURES}"


def test_a_multipart_form_is_named_as_not_taken(server):
    for model, advice in (("digits_image", RAW), ("digits", NO_PICTURES)):
        for kind in ("JPEG", "large JPEG"):
            form = aiohttp.FormData()
            form.add_field("x", pictures()[kind], filename="cat.jpg", content_type="image/jpeg")
            assert error_of(server, model, data=form) == f"{NOT_JSON}{FORM}{advice}", (model, kind)
        form = aiohttp.MultipartWriter("form-data")  # a text field, as curl -F x=hello sends: "no digit after sign"
        form.append("hello").set_content_disposition("form-data", name="x")
        assert error_of(server, model, data=form) == f"{NOT_JSON}{FORM}{advice}"
    # other bodies keep the JSON parser's words
    assert error_of(server, "digits", data=b'{"inputs": [') == (
        f"{NOT_JSON}unexpected end of data: line 1 column 13 (char 12)")
    assert error_of(server, "digits", data=b"--x\r\nnot a form\r\n").startswith(f"{NOT_JSON}no digit after sign")
    assert error_of(server, "digits_image", data=b"\x00\xff\xd8") == (
        f"{NOT_JSON}it is not UTF-8 text (binary tensor data goes after the JSON part, whose length "
        "Inference-Header-Content-Length gives)")


def _spec(name: str, datatype: str, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(name, datatype, np.dtype(object if datatype == "BYTES" else np.float32), shape)


def test_a_model_a_raw_body_cannot_feed_is_told_the_json_form():
    """A raw body is one picture for a single-input model (codec._decode_raw): a model of two
    inputs, or one taking two pictures a request, is told to send them in JSON."""
    want = ("send pictures base64 in a JSON body as input 'image', datatype BYTES, shape [N] (or with the binary "
            "tensor extension); a body that is one picture alone is for a model of one input that takes one picture")
    two_inputs = {"image": _spec("image", "BYTES", (-1,)), "size": _spec("size", "FP32", (-1, 2))}
    assert how_to_send(two_inputs) == want
    assert how_to_send({"image": _spec("image", "BYTES", (2,))}) == want
    assert how_to_send({"image": _spec("image", "BYTES", (1,))}, "GIF").startswith(
        "send a picture (a JPEG or PNG, not GIF) as the whole body")
