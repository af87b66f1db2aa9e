"""Images in, labels out, through a real server: the shipped image-input digits example read by
tritonclient and by a curl-style JSON body, AIPP OM vs host normalisation, BYTES framing in
JSON and binary, decode errors naming the row, decompression bombs, the pending-image bound,
labels in classification and metadata, and load-time refusals. What decoding pictures is charged
to the request memory: test_server_images_memory.py."""
from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
import tritonclient.grpc as grpc_client
import tritonclient.http as http
from onnx import TensorProto, helper
from PIL import Image

from aclserve.om import aipp
from tests import REPO
from tests.images.images_data import encode, gradient, png_bomb
from tests.serving import ServerThread, free_port, request, server_config
from tests.tiny_models import MEAN, STD, compile_cpu_om, conv_onnx, save_graph

from .image_requests import DIGITS, b64, digit_png, infer

MAX_PENDING = 8


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("image_models")
    src = tmp_path_factory.mktemp("image_src")
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om", "digits.yaml"):
        shutil.copy(os.path.join(REPO, "models", name), root / name)
    onnx_path = conv_onnx(src / "conv.onnx")
    ops = [aipp.generate("rgb", ",".join(map(str, MEAN)), ",".join(map(str, STD)))]
    compile_cpu_om(onnx_path, root / "conv_aipp.om", batch="1,2,4", aipp=ops)
    compile_cpu_om(onnx_path, root / "conv_host.om", batch="1,2,4")
    bgr = [aipp.generate("bgr", ",".join(map(str, MEAN)), ",".join(map(str, STD)))]  # it takes BGR pixels
    compile_cpu_om(onnx_path, root / "conv_aipp_bgr.om", batch="1,2,4", aipp=bgr)
    crop = "    image: {resize: center_crop, crop_fraction: 0.875}\n"
    (root / "conv_aipp.yaml").write_text("inputs:\n  x:\n" + crop)
    (root / "conv_aipp_bgr.yaml").write_text("inputs:\n  x:\n" + crop)  # no colour: the OM's AIPP says it
    (root / "conv_host.yaml").write_text("inputs:\n  x:\n" + crop.replace(
        "}", f", mean: {MEAN.tolist()}, std: {STD.tolist()}}}"))
    for name, image in (("crop_past_whole", "{resize: center_crop, crop_fraction: 1.5}"),
                        ("std_zero", f"{{mean: {MEAN.tolist()}, std: [58.395, 0, 57.375]}}")):
        shutil.copy(root / "conv_host.om", root / f"{name}.om")
        (root / f"{name}.yaml").write_text(f"inputs:\n  x:\n    image: {image}\n")
    shutil.copy(root / "conv_aipp.om", root / "bad_plan.om")
    (root / "bad_plan.yaml").write_text("inputs:\n  x:\n    image: {mean: 127}\n")
    compile_cpu_om(fp16_onnx(src / "fp16.onnx"), root / "fp16_range.om", batch="1,2")
    shutil.copy(root / "fp16_range.om", root / "fp16_inf.om")
    (root / "fp16_range.yaml").write_text("inputs:\n  x:\n    image: {mean: [0, 0, 0], std: [0.005, 0.005, 0.005]}\n")
    (root / "fp16_inf.yaml").write_text(  # (as the tester wrote it: a flat picture of 200 answered all inf)
        "inputs:\n  x:\n    image: {interpolation: nearest, mean: [0, 0, 0], std: [0.001, 0.001, 0.001]}\n")
    shutil.copy(root / "digits.om", root / "bad_labels.om")
    (root / "three.txt").write_text("a\nb\nc\n")
    (root / "bad_labels.yaml").write_text("outputs:\n  y: {labels: three.txt}\n")
    config = server_config(root, images={"max_pending": MAX_PENDING, "workers": 2}, grpc_port=free_port())
    with ServerThread(config) as srv:
        srv.grpc_url = f"127.0.0.1:{srv.config.grpc_port}"
        yield srv


def fp16_onnx(path) -> str:
    """y = relu(x), FP16 [N, 3, 8, 8] both: an FP16 image input normalised on the host."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "fp16", [vi("x", TensorProto.FLOAT16,
                              ["N", 3, 8, 8])], [vi("y", TensorProto.FLOAT16, ["N", 3, 8, 8])])
    return save_graph(graph, path)


@pytest.fixture
def http_client(image_server):
    """tritonclient's HTTP client, closed on this thread (left to the garbage collector, its
    gevent pool may close on another thread and fail there)."""
    with http.InferenceServerClient(image_server.url) as client:
        yield client


def test_digit_pictures_come_back_with_their_labels(http_client):
    """Held-out digits rendered at other sizes, both polarities, sent with tritonclient (binary
    BYTES, [N, 1]): the labels come back at the model's accuracy."""
    client = http_client
    x, y = DIGITS["x"], DIGITS["y"]
    for size, dark, resample in ((32, False, Image.NEAREST), (24, True, Image.BILINEAR)):
        correct = 0
        for start in range(0, len(y), MAX_PENDING):
            blobs = [digit_png(v, size, dark, resample) for v in x[start:start + MAX_PENDING]]
            inp = http.InferInput("x", [len(blobs), 1], "BYTES")
            inp.set_data_from_numpy(np.array(blobs, dtype=object).reshape(-1, 1))
            out = http.InferRequestedOutput("y", class_count=1)
            answers = client.infer("digits_image", [inp], outputs=[out]).as_numpy("y")
            labels = [int(a.decode().split(":")[2]) for a in answers.ravel()]
            correct += sum(int(a == b) for a, b in zip(labels, y[start:start + MAX_PENDING]))
        assert correct / len(y) >= float(DIGITS["accuracy"]) - 0.03, (size, dark, correct / len(y))


def test_pictures_over_grpc_raw_and_typed_contents(image_server):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(image_server.grpc_url)
    blobs = [digit_png(DIGITS["x"][i], 24) for i in range(4)]
    inp = grpcclient.InferInput("x", [4, 1], "BYTES")
    inp.set_data_from_numpy(np.array(blobs, dtype=object).reshape(-1, 1))  # raw_input_contents
    out = grpcclient.InferRequestedOutput("y", class_count=1)
    answers = client.infer("digits_image", [inp], outputs=[out]).as_numpy("y")
    assert [a.decode().split(":")[2] for a in answers.ravel()] == [str(v) for v in DIGITS["y"][:4]]
    from tritonclient.grpc import service_pb2 as pb
    request = pb.ModelInferRequest(model_name="digits_image", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="BYTES", shape=[2], contents=pb.InferTensorContents(bytes_contents=blobs[:2]))])
    response = client._client_stub.ModelInfer(request)
    probs = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 10)
    assert list(probs.argmax(1)) == list(DIGITS["y"][:2])
    bad = grpcclient.InferInput("x", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"not a picture"], dtype=object))
    with pytest.raises(Exception, match="input 'x' row 0: not a JPEG or PNG image"):
        client.infer("digits_image", [bad])
    wrong_field = pb.ModelInferRequest(model_name="digits_image", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(int_contents=[1]))])
    with pytest.raises(Exception, match=r"contents.int_contents given for BYTES \(expected contents.bytes_contents\)"):
        client._client_stub.ModelInfer(wrong_field)  # (it said bytes_contents had 0 elements)
    nothing = pb.ModelInferRequest(model_name="digits_image", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="BYTES", shape=[1])])
    with pytest.raises(Exception) as refused:  # (it said "bytes_contents has 0 elements"; as HTTP, no data)
        client._client_stub.ModelInfer(nothing)
    assert refused.value.details() == "input 'x' has neither raw_input_contents nor contents.bytes_contents"


def test_curl_style_json_base64_and_raw_binary(image_server):
    png = digit_png(DIGITS["x"][0], 40)
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [b64(png)]}],
            "outputs": [{"name": "y", "parameters": {"classification": 2}}]}
    status, _, out = infer(image_server, body, "digits_image")
    assert status == 200
    top = out["outputs"][0]
    assert top["datatype"] == "BYTES" and top["shape"] == [1, 2]
    score, index, label = top["data"][0].split(":")
    assert int(index) == int(DIGITS["y"][0]) and label == str(DIGITS["y"][0]) and 0 < float(score) <= 1
    pngs = [digit_png(DIGITS["x"][i], 20 + i) for i in (3, 4)]  # nested data, shape [2, 1]
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2, 1], "data": [[b64(p)] for p in pngs]}],
            "outputs": [{"name": "y", "parameters": {"classification": 1}}]}
    status, _, out = infer(image_server, body, "digits_image")
    assert status == 200 and [d.split(":")[2] for d in out["outputs"][0]["data"]] == [str(v) for v in DIGITS["y"][3:5]]
    status, headers, raw = request(image_server, "POST", "/v2/models/digits_image/infer", data=png,
                                   headers={"Inference-Header-Content-Length": "0"})
    assert status == 200
    n = int(headers["Inference-Header-Content-Length"])
    probs = np.frombuffer(raw[n:], np.float32)
    assert probs.argmax() == DIGITS["y"][0]


def test_aipp_om_answers_as_the_float_model_with_host_normalisation(http_client):
    client = http_client
    pictures = [encode(gradient(30 + 7 * i, 41, seed=i), "JPEG", quality=90) for i in range(3)]
    pictures.append(encode(gradient(20, 20, seed=9)))
    results = {}
    for model in ("conv_aipp", "conv_aipp_bgr", "conv_host"):
        inp = http.InferInput("x", [len(pictures)], "BYTES")
        inp.set_data_from_numpy(np.array(pictures, dtype=object))
        results[model] = client.infer(model, [inp]).as_numpy("y")
    assert results["conv_aipp"].shape == (4, 4, 16, 16)
    # AIPP normalises in fp16 (min/var_reci held as fp16, each step rounded), the host in float32:
    # up to ~3e-3 per input element, about 1e-2 after the 27-tap convolution
    np.testing.assert_allclose(results["conv_aipp"], results["conv_host"], rtol=1e-5, atol=0.03)
    # an AIPP that swaps R and B takes BGR pixels (acl.mdl.get_first_aipp_info's rbuvSwapSwitch):
    # its model's settings need not say so; fed RGB, the network saw the colours swapped
    np.testing.assert_allclose(results["conv_aipp_bgr"], results["conv_host"], rtol=1e-5, atol=0.03)
    image = client.get_model_metadata("conv_aipp_bgr")["inputs"][0]["parameters"]
    assert image["color"] == "bgr", image


def test_bad_images_get_400_naming_the_row(image_server):
    good = b64(digit_png(DIGITS["x"][1], 16))
    cases = [
        ([good, b64(b"not a picture at all"), good], "input 'x' row 1: not a JPEG or PNG image"),
        ([good, good, b64(encode(gradient(8, 8), "GIF"))], "input 'x' row 2: GIF images are not accepted"),
        (["%%%", good], "input 'x' row 0: not valid base64: it has a character outside the base64 alphabet at character 0"),
        ([good[:76] + "\n" + good[76:]], "input 'x' row 0: not valid base64: it has a space or line break "
                                         "(base64 tools wrap lines: `base64 -w0`) at character 76"),
        (["QUI=" + good], "input 'x' row 0: not valid base64: it has '=' before its end"),
        ([good + "A"], "input 'x' row 0: not valid base64: its length is not a multiple of 4"),
        ([b64(encode(gradient(64, 64))[:300])], "input 'x' row 0: PNG could not be decoded"),
        ([b64(png_bomb())], "input 'x' row 0: PNG header announces 60000x60000 pixels; the limit is 40,000,000"),
        ([good, 5], "input 'x' row 1: BYTES data elements must be base64 strings"),
    ]
    for data, message in cases:
        body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [len(data), 1], "data": data}]}
        status, _, out = infer(image_server, body, "digits_image")
        assert status == 400 and out["error"].startswith(message), (message, out)
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [good], "parameters": {"p": [1]}}]}
    status, _, out = infer(image_server, body, "digits_image")
    assert status == 400 and out["error"] == ('input \'x\': parameter "p" must be a string, number or boolean, '
                                              'got an array of 1 item'), out
    # numbers for an image input (a .npy through `aclserve infer`): said to be one (a helper's find)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
    status, _, out = infer(image_server, body, "digits_image")
    assert status == 400 and out["error"] == ('input \'x\': datatype "FP32" does not match the model\'s BYTES (an '
                                              'image input: it takes JPEG or PNG files, each one element)'), out
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [good]}]}
    assert infer(image_server, body, "digits_image")[0] == 200  # and the server carries on


def _framed(elements: list[bytes], shape, declared: int | None = None, extra: bytes = b""):
    chunk = b"".join(struct.pack("<I", len(e)) + e for e in elements) + extra
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": shape,
                                   "parameters": {"binary_data_size": declared if declared is not None
                                                  else len(chunk)}}]}).encode()
    return head + chunk, {"Inference-Header-Content-Length": str(len(head))}


def test_binary_bytes_framing(image_server):
    png = digit_png(DIGITS["x"][2], 16)
    body, headers = _framed([png, png], [2, 1])
    status, _, raw = request(image_server, "POST", "/v2/models/digits_image/infer", data=body, headers=headers)
    assert status == 200
    cases = [
        (_framed([png], [2]), "input 'x' row 1: binary data ends before the element's 4-byte length"),
        (_framed([png], [1], extra=b"\x01\x02"), "input 'x': 2 bytes after the 1 elements its shape gives"),
        (_framed([png[:10]], [1], extra=b""), "input 'x' row 0: PNG is truncated"),
        (_framed([png, png], [2, 2]), "input 'x': shape must be [N] or [N, 1]"),
        (_framed([png], [1], declared=10 ** 6), "input 'x': binary data needs 1000000 bytes"),
    ]
    oversized = struct.pack("<I", 10 ** 6) + png
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(oversized)}}]}).encode()
    cases.append(((head + oversized, {"Inference-Header-Content-Length": str(len(head))}),
                  "input 'x' row 0: element of 1000000 bytes overruns"))
    for (data, hdrs), message in cases:
        status, _, raw = request(image_server, "POST", "/v2/models/digits_image/infer", data=data, headers=hdrs)
        assert status == 400 and json.loads(raw)["error"].startswith(message), (message, raw)


def test_a_picture_sent_without_its_length_prefix_is_named(image_server):
    """A PNG's signature read as the element's length was "element of 1196314761 bytes overruns the
    ...-byte binary data", which did not say what was wrong (an independent tester)."""
    png, jpeg = digit_png(DIGITS["x"][2], 16), encode(gradient(16, 16), "JPEG")
    for picture, length, kind in ((png, 1196314761, "PNG"), (jpeg, int.from_bytes(jpeg[:4], "little"), "JPEG")):
        head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1],
                                       "parameters": {"binary_data_size": len(picture)}}]}).encode()
        status, _, raw = request(image_server, "POST", "/v2/models/digits_image/infer", data=head + picture,
                                 headers={"Inference-Header-Content-Length": str(len(head))})
        assert status == 400 and json.loads(raw)["error"] == (
            f"input 'x' row 0: element of {length} bytes overruns the {len(picture)}-byte binary data (its length "
            f"bytes begin a {kind}: a picture sent without its 4-byte little-endian length before it?)"), raw


def test_a_request_of_more_images_than_are_ever_decoded_at_once_gets_413(image_server):
    """It can never fit, so not a 503 to retry (found by an independent check); saturation by
    several requests is the pool's test (tests/images)."""
    png = b64(digit_png(DIGITS["x"][3], 16))
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [MAX_PENDING + 1], "data": [png] * (MAX_PENDING + 1)}]}
    status, headers, out = infer(image_server, body, "digits_image")
    assert status == 413 and "images.max_pending" in out["error"] and "send fewer" in out["error"], out
    assert not headers.get("Retry-After")


def test_labels_in_classification_metadata_and_config(http_client):
    client = http_client
    x = http.InferInput("x", [2, 64], "FP32")
    x.set_data_from_numpy(DIGITS["x"][:2])
    answers = client.infer("digits", [x], outputs=[http.InferRequestedOutput("y", class_count=3)]).as_numpy("y")
    assert answers.shape == (2, 3)
    for row, truth in zip(answers, DIGITS["y"][:2]):
        score, index, label = row[0].decode().split(":")
        assert index == label == str(truth)
    meta = client.get_model_metadata("digits_image")
    assert meta["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [-1, 1], "parameters": {
        "content": "image", "formats": "jpeg,png", "color": "gray", "size": "8x8", "resize": "stretch",
        "tensor_datatype": "UINT8"}}]
    assert meta["outputs"][0]["parameters"] == {"label_filename": "digits_labels.txt"}
    config = client.get_model_config("digits_image")
    assert config["output"][0]["label_filename"] == "digits_labels.txt"
    assert config["input"][0]["data_type"] == "TYPE_STRING" and config["input"][0]["dims"] == [1]


def test_grpc_metadata_and_config_of_models_with_labels_and_image_inputs(image_server):
    """The tensors' parameters (image decoding, label file) have no field in Triton's gRPC
    TensorMetadata: ModelMetadata answered INTERNAL for these models; the config carries the
    labels."""
    with grpc_client.InferenceServerClient(image_server.grpc_url) as client:
        for model in ("digits", "digits_image"):
            meta = client.get_model_metadata(model, as_json=True)
            assert meta["name"] == model and meta["outputs"][0]["name"] == "y"
        assert client.get_model_metadata("digits_image", as_json=True)["inputs"][0]["datatype"] == "BYTES"
        config = client.get_model_config("digits_image", as_json=True)["config"]
        assert config["output"][0]["label_filename"] == "digits_labels.txt"


def test_settings_that_do_not_fit_refuse_the_load(image_server):
    status, _, raw = request(image_server, "POST", "/v2/repository/index", data=b"")
    index = {e["name"]: e for e in json.loads(raw)}
    assert index["bad_plan"]["state"] == "UNAVAILABLE"
    assert index["bad_plan"]["reason"] == ("<models>/bad_plan.yaml: inputs.x.image.mean: the model takes uint8 pixels "
                                           "(AIPP normalises on the device); remove mean/std")
    # refused as the model's YAML is read, naming the key (unchecked, a crop past the whole picture
    # decodes, padded, and a std of 0 is refused later as values up to inf)
    assert index["crop_past_whole"]["state"] == "UNAVAILABLE"
    assert "inputs.x.image.crop_fraction: must be in (0, 1], got 1.5" in index["crop_past_whole"]["reason"]
    assert index["std_zero"]["state"] == "UNAVAILABLE"
    assert "inputs.x.image.std: must not contain 0" in index["std_zero"]["reason"], index["std_zero"]["reason"]
    assert index["bad_labels"]["state"] == "UNAVAILABLE"
    assert "three.txt has 3 labels; output 'y' has 10 classes" in index["bad_labels"]["reason"]
    assert index["digits_image"]["state"] == "READY"
    # an FP16 input whose mean/std make pixels into values past 65504 (inf): refused, naming them
    assert index["fp16_inf"]["state"] == "UNAVAILABLE"
    assert index["fp16_inf"]["reason"].startswith(
        "<models>/fp16_inf.yaml: inputs.x.image.std: with mean [0, 0, 0] and std [0.001, 0.001, 0.001], pixels 0-255 "
        "become values up to 255000 in size, beyond FP16's largest, 65504 (the model would get inf)")
    assert index["fp16_range"]["state"] == "READY"
    flat = encode(np.full((8, 8, 3), 200, np.uint8))
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [b64(flat)]}]}
    status, _, out = infer(image_server, body, "fp16_range")
    assert status == 200 and set(out["outputs"][0]["data"]) == {40000.0}, out  # 200 / 0.005


def test_an_aipp_om_takes_pictures_with_model_defaults_image_settings_but_their_mean_and_std(tmp_path):
    """model_defaults' image settings with a mean and std (for the float models) were passed over
    whole for an OM whose AIPP normalises, as they do not fit its uint8 input: the input stayed a
    UINT8 tensor and a client's PNG got 400 (found in review). Now only their mean and std are:
    it answers the pictures as the same OM whose own settings leave those two out."""
    for name in ("defaulted", "reference"):
        shutil.copy(os.path.join(REPO, "models", "digits_image.om"), tmp_path / f"{name}.om")
    (tmp_path / "reference.yaml").write_text("inputs: {x: {image: {mean: null, std: null}}}\n")
    image = {"color": "gray", "interpolation": "area", "invert": "auto", "mean": [100], "std": [50]}
    config = server_config(tmp_path, **{"model_defaults.inputs": {"x": {"image": image}}})
    pictures = [b64(digit_png(values, 16)) for values in DIGITS["x"][:4]]
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [4], "data": pictures}]}
    with ServerThread(config) as srv:
        (status, _, defaulted), (_, _, reference) = (infer(srv, body, name) for name in ("defaulted", "reference"))
    assert status == 200, defaulted
    assert defaulted["outputs"] == reference["outputs"] and len(reference["outputs"][0]["data"]) == 40


def test_dvpp_decoder_asked_for_on_the_cpu_runtime_is_its_dvpp_emulation(caplog):
    """The CPU runtime's acl.media runs DvppDecoder; what DVPP does not take (a PNG, an 8x8
    target under VPC's 10x6) still decodes, on the CPU, without a warning."""
    from aclserve.config import ImageInput, ImageSettings
    from aclserve.images.plan import build_plan
    from aclserve.runtime import AclRuntime
    from aclserve.runtime.types import TensorSpec
    from aclserve.server.images import ImageDecoding

    plan = build_plan(ImageInput(), TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, 8, 8, 1), "NHWC"))
    with AclRuntime(device="cpu") as runtime:
        decoding = ImageDecoding(ImageSettings(decoder="dvpp"), runtime)
        try:
            pixels = decoding.decode(digit_png(DIGITS["x"][0], 16), plan)
            assert decoding._decoder.kind == "dvpp"
        finally:
            decoding.close()
    assert pixels.shape == (8, 8, 1)
    assert "DVPP" not in caplog.text and "Pillow" not in caplog.text
