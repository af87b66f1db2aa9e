"""A real server with `images.decoder: dvpp` on the CPU runtime: DvppDecoder decodes and resizes
the JPEGs on the runtime's DVPP emulation, and the model answers as it does for the same
pictures decoded by Pillow (NV12's halved chroma and VPC's bilinear filter: within a tolerance)."""
from __future__ import annotations

import logging
import urllib.request

import numpy as np
import tritonclient.http as http

from aclserve.acl.cpu import faults
from tests.images.images_data import encode, gradient, sampled_jpeg
from tests.serving import ServerThread, server_config
from tests.tiny_models import MEAN, STD, compile_cpu_om, conv_onnx


def answers(models_dir, decoder: str, pictures: list[bytes]) -> tuple[np.ndarray, str]:
    """The model's answer to `pictures` decoded by `decoder`, and the server's /metrics after it."""
    config = server_config(models_dir, images={"decoder": decoder, "workers": 2})
    with ServerThread(config) as srv, http.InferenceServerClient(srv.url) as client:
        inp = http.InferInput("x", [len(pictures)], "BYTES")
        inp.set_data_from_numpy(np.array(pictures, dtype=object))
        answer = client.infer("conv", [inp]).as_numpy("y")
        with urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30) as r:
            return answer, r.read().decode()


def test_a_server_decoding_with_dvpp_answers_as_with_pillow(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    compile_cpu_om(conv_onnx(tmp_path / "conv.onnx", side=32), root / "conv.om", batch="1,2,4")
    (root / "conv.yaml").write_text("inputs:\n  x:\n    image: {resize: stretch, mean: %s, std: %s}\n"
                                    % (MEAN.tolist(), STD.tolist()))
    pictures = [encode(gradient(96 + 16 * i, 128, seed=i), "JPEG", quality=95) for i in range(3)]
    png = encode(gradient(96, 128, seed=3))  # not DVPP's: decoded on the CPU, counted so
    counted = faults.inject("dvpp", delay_ms=0.001)  # counts the JPEGD and VPC tasks that run
    try:
        by_dvpp, dvpp_metrics = answers(root, "dvpp", pictures + [png])
        assert counted.fired == 2 * len(pictures)
        by_pillow, cpu_metrics = answers(root, "cpu", pictures + [png])
    finally:
        faults.clear()
    assert by_dvpp.shape == by_pillow.shape == (4, 4, 32, 32)
    assert 'aclserve_dvpp_decodes_total{outcome="dvpp"} 3.0' in dvpp_metrics
    assert 'aclserve_dvpp_decodes_total{outcome="not_taken"} 1.0' in dvpp_metrics
    assert 'aclserve_dvpp_decodes_total{outcome="failed"} 0.0' in dvpp_metrics
    assert "aclserve_dvpp_decodes" not in cpu_metrics
    # pixels within a few levels of Pillow's (tests/images/test_images_dvpp.py) move the 27-tap
    # convolution's outputs by 0.13 on average, 0.76 at most (measured); answers average 2.6
    diff = np.abs(by_dvpp - by_pillow)
    assert diff.mean() < 0.25 and diff.max() < 2.0, (diff.mean(), diff.max())
    assert np.abs(by_pillow).mean() > 1  # the answers are not all near zero


def test_an_input_dvpp_never_takes_is_said_at_load(tmp_path, caplog):
    """With images.decoder dvpp, an image input whose plan DVPP never takes (a center_crop input,
    the ImageNet-style one; an odd-sided target) decoded on the CPU in silence: the README said
    only that the input must be bilinear (found by an independent tester). One INFO line per
    such input, at its load, says why; none for an input DVPP may take, none with decoder cpu."""
    root = tmp_path / "models"
    root.mkdir()
    for name, side, image in (("crop", 32, "{resize: center_crop, crop_fraction: 0.875, interpolation: bicubic}"),
                              ("odd", 31, "{resize: stretch}"), ("even", 32, "{resize: stretch}")):
        compile_cpu_om(conv_onnx(tmp_path / f"{name}.onnx", side=side), root / f"{name}.om", batch="1")
        (root / f"{name}.yaml").write_text(f"inputs:\n  x:\n    image: {image}\n")
    said = {}
    for decoder in ("dvpp", "cpu"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="aclserve.server.images"):
            with ServerThread(server_config(root, images={"decoder": decoder}, model_control_mode="none")):
                pass
        said[decoder] = sorted(r.getMessage() for r in caplog.records if r.name == "aclserve.server.images")
    assert said["dvpp"] == [
        "crop:1: image input 'x' never decodes on DVPP (images.decoder: dvpp): its resize is center_crop, and DVPP "
        "only stretches; its interpolation is bicubic, and VPC resizes with its own filter; its pictures decode on "
        "the CPU",
        "odd:1: image input 'x' never decodes on DVPP (images.decoder: dvpp): its size 31x31 has an odd side; its "
        "pictures decode on the CPU"]
    assert said["cpu"] == []


def test_a_jpeg_jpegd_refuses_for_its_sampling_decodes_on_the_cpu_quietly(tmp_path, caplog):
    """JPEGD decodes 4:4:4, 4:2:2, 4:2:0, 4:0:0 and 4:4:0 JPEGs only (CANN's JPEGD constraints);
    dvpp_takes did not look at the sampling, so a 4:1:1 JPEG (Y 4x1) went to DVPP, which on a
    device refuses it (148052): counted failed, with the "DVPP decode failed" warning (found by a
    fidelity tester, t70, whose CPU runtime decoded it). Now it goes to the CPU decoder at once:
    the answer is the CPU decoder's, counted not_taken, no warning."""
    root = tmp_path / "models"
    root.mkdir()
    compile_cpu_om(conv_onnx(tmp_path / "conv.onnx", side=32), root / "conv.om", batch="1")
    (root / "conv.yaml").write_text("inputs:\n  x:\n    image: {resize: stretch}\n")
    picture = sampled_jpeg(gradient(96, 128, seed=5), (4, 1))
    with caplog.at_level(logging.WARNING, logger="aclserve.images.dvpp"):
        by_dvpp, dvpp_metrics = answers(root, "dvpp", [picture])
    by_cpu, _ = answers(root, "cpu", [picture])
    assert np.array_equal(by_dvpp, by_cpu)
    assert 'aclserve_dvpp_decodes_total{outcome="not_taken"} 1.0' in dvpp_metrics
    assert 'aclserve_dvpp_decodes_total{outcome="failed"} 0.0' in dvpp_metrics
    assert 'aclserve_dvpp_decodes_total{outcome="dvpp"} 0.0' in dvpp_metrics
    assert [r.getMessage() for r in caplog.records if r.name == "aclserve.images.dvpp"] == []
