"""DvppDecoder (images/dvpp.py) run for real on the CPU runtime's DVPP emulation (acl.media):
its pictures against Pillow's, its descriptors given back after every image and its buffers at
close, what it leaves to the CPU decoder (what DVPP does not take, a failed task, a hung one), and a pyACL
without acl.media."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

from aclserve.config import ImageInput
from aclserve.images import dvpp
from aclserve.images.decode import CpuDecoder
from aclserve.images.header import probe
from aclserve.images.peak import decode_peak_bytes
from aclserve.images.plan import build_plan
from aclserve.runtime import AclRuntime
from aclserve.runtime.types import TensorSpec
from tests import REPO
from tests.images.images_data import encode, gradient

# NV12 keeps one U,V pair per 2x2 pixels and VPC's filter is not Pillow's: pictures agree with
# Pillow's decode + resize to within these (measured: mean 2.2, max 8 on the 320x240 gradient)
MEAN_TOLERANCE, MAX_TOLERANCE = 4.0, 24


def plan(h: int, w: int, color: str = "rgb"):
    channels = 1 if color == "gray" else 3
    return build_plan(ImageInput(color=color), TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, h, w, channels), "NHWC"))


@pytest.fixture(scope="module")
def runtime():
    with AclRuntime(device="cpu") as rt:
        yield rt


@pytest.fixture
def decoder(runtime):
    cpu = CpuDecoder(1 << 26, 8192)
    d = dvpp.DvppDecoder(runtime, cpu)
    yield d
    d.close()
    runtime.acl.faults.clear()


def tasks_run(acl):
    """A fault that only counts: how many JPEGD/VPC tasks run from now on (fired)."""
    return acl.faults.inject("dvpp", delay_ms=0.001)


@pytest.mark.parametrize("color", ["rgb", "bgr", "gray"])
def test_a_jpeg_decodes_and_resizes_as_pillow_does(runtime, decoder, color):
    data = encode(gradient(240, 320), "JPEG", quality=95)
    counted = tasks_run(runtime.acl)
    got = decoder(data, plan(62, 100, color))  # VPC output stride 112: not the width
    want = decoder._fallback(data, plan(62, 100, color))
    assert counted.fired == 2  # JPEGD and VPC ran: not the fallback
    assert decoder.outcomes == {dvpp.DECODED: 1}
    assert got.shape == want.shape and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - want)
    assert diff.mean() < MEAN_TOLERANCE and diff.max() <= MAX_TOLERANCE, (diff.mean(), diff.max())
    if color == "bgr":
        assert np.abs(got[..., ::-1].astype(int) - decoder(data, plan(62, 100, "rgb"))).max() == 0


def test_a_picture_narrower_than_vpcs_least_stride_resizes_on_dvpp(runtime, decoder):
    """A 12-pixel-wide target had a width stride of 16 (aligned to 16): CANN's VPC takes 32 at
    least, so on a device it fell back to the CPU decoder (an independent check)."""
    data = encode(gradient(240, 320), "JPEG", quality=95)
    got = decoder(data, plan(12, 12))
    assert decoder.outcomes == {dvpp.DECODED: 1}
    diff = np.abs(got.astype(int) - decoder._fallback(data, plan(12, 12)))
    assert diff.mean() < MEAN_TOLERANCE and diff.max() <= MAX_TOLERANCE, (diff.mean(), diff.max())


def traced_second_decode(decoder, data, picture_plan):
    """(pixels, peak bytes traced) of the picture's second decode on DVPP: the kept DVPP buffers
    grown by the first (DVPP memory, kept between images)."""
    decoder(data, picture_plan)
    tracemalloc.start()
    try:
        pixels = decoder(data, picture_plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoder.outcomes == {dvpp.DECODED: 2}
    return pixels, peak


@pytest.mark.parametrize("source, target, color", [
    ((256, 256), (1024, 1024), "rgb"), ((256, 256), (1024, 1024), "gray"), ((96, 128), (768, 1024), "bgr"),
    ((512, 32), (2048, 12), "rgb"),  # a width stride of 32 for 12 pixels
])
def test_what_a_dvpp_decode_holds_is_within_its_charge(decoder, source, target, color):
    """A request is charged decode_peak_bytes (images/peak.py) before its pictures decode,
    whichever decoder: DVPP's host side (the NV12 copied back and its conversion to pixels) must
    hold no more. It converted through float32 planes and their upsampled copies: 49.5 bytes a
    pixel of an RGB target, 10 charged, 4.7 times the whole charge here (a reviewer measured 52).
    Enlarged pictures: what the emulation itself holds as JPEGD's and VPC's work is small then
    (on a device it is the chip's memory), so the peak traced over the call is the host side's."""
    data = encode(gradient(*source), "JPEG", quality=90)
    picture_plan = plan(*target, color)
    pixels, peak = traced_second_decode(decoder, data, picture_plan)
    assert pixels.shape == (*target, 1 if color == "gray" else 3)
    assert peak <= decode_peak_bytes(probe(data), picture_plan), peak


def test_a_dvpp_decode_holds_no_copy_of_the_picture(decoder):
    """The picture, a memoryview into the request's body, was copied whole (bytes(data), for
    bytes_to_ptr) under no charge: it is copied once, into DVPP memory, and the CPU runtime's JPEGD
    reads that in place, as a chip does. A small JPEG with 16 MB after its end (as a motion photo
    carries its video) so that the pixel work is small beside it: it held twice the picture."""
    picture = encode(gradient(64, 64), "JPEG", quality=90) + np.random.default_rng(0).bytes(16 << 20)
    body = bytearray(b"head" + picture)
    view = memoryview(body)[4:]
    picture_plan = plan(64, 64)
    pixels, peak = traced_second_decode(decoder, view, picture_plan)
    np.testing.assert_array_equal(pixels, decoder(picture, picture_plan))
    assert peak < len(picture) // 8, peak


def test_descriptors_go_back_after_each_image_and_buffers_are_kept_until_close(runtime, monkeypatch):
    # CANN's acldvppMalloc page advises against a malloc and free per image: the decoder keeps
    # its three buffers (the JPEG, JPEGD's picture, VPC's), grown to the largest image so far
    monkeypatch.setattr(dvpp, "KEPT_MAX_BYTES", 256 << 10)
    acl = runtime.acl
    before, media_before = acl.memory_stats(0), acl.media_stats()
    d = dvpp.DvppDecoder(runtime, CpuDecoder(1 << 26, 8192))
    kept = (d._jpeg, d._decoded, d._resized)
    try:
        sizes = []
        for i, (h, w) in enumerate(((240, 320), (64, 64), (240, 320), (480, 640), (64, 64))):
            counted = tasks_run(acl)
            d(encode(gradient(h, w, seed=i), "JPEG"), plan(32, 48))
            assert counted.fired == 2  # decoded on DVPP
            stats = acl.media_stats()
            assert stats["buffers"] == media_before["buffers"] + 3  # one-off buffers are gone too
            assert (stats["pic_descs"], stats["resize_configs"]) == (media_before["pic_descs"], 0)
            sizes.append([(k.ptr, k.capacity) for k in kept])
        assert sizes[1] == sizes[0] == sizes[2]  # a smaller image and the same again: no new buffer
        # 480 x 640: JPEGD's 460,800 bytes are over KEPT_MAX_BYTES (a buffer for that image
        # alone); the kept one stays as it was
        assert sizes[3][1] == sizes[0][1] and sizes[4] == sizes[3]
        assert all(capacity >= dvpp.KEPT_MIN_BYTES and capacity & (capacity - 1) == 0 for _, capacity in sizes[0])
    finally:
        d.close()
    after = acl.memory_stats(0)
    assert (after["used"], after["allocations"]) == (before["used"], before["allocations"])
    assert acl.media_stats() == media_before


@pytest.mark.parametrize("data, target", [
    (encode(gradient(240, 320), "JPEG", progressive=True), (64, 96)),  # JPEGD decodes no progressive JPEG
    (encode(gradient(240, 320)), (64, 96)),  # PNG
    (encode(gradient(64, 64), "JPEG"), (8, 8)),  # under VPC's smallest output (10 x 6), at 1/8
    (encode(gradient(16, 16), "JPEG"), (16, 16)),  # under JPEGD's 32 a side
], ids=["progressive", "png", "under_vpc_output", "under_jpegd"])
def test_what_dvpp_does_not_take_decodes_on_the_cpu(runtime, decoder, data, target, caplog):
    counted = tasks_run(runtime.acl)
    got = decoder(data, plan(*target))
    assert counted.fired == 0
    np.testing.assert_array_equal(got, decoder._fallback(data, plan(*target)))
    assert "DVPP decode failed" not in caplog.text
    assert decoder.outcomes == {dvpp.NOT_TAKEN: 1}  # what /metrics reports (aclserve_dvpp_decodes)


def test_a_plan_of_another_interpolation_than_bilinear_decodes_on_the_cpu(runtime, decoder):
    """VPC resizes bilinearly: a plan asking for nearest got VPC's smoothed pixels; now Pillow's
    nearest pixels, exactly."""
    data = encode(gradient(240, 320), "JPEG")
    nearest = build_plan(ImageInput(interpolation="nearest"),
                         TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, 64, 96, 3), "NHWC"))
    counted = tasks_run(runtime.acl)
    np.testing.assert_array_equal(decoder(data, nearest), decoder._fallback(data, nearest))
    assert counted.fired == 0 and decoder.outcomes == {dvpp.NOT_TAKEN: 1}


def test_a_failed_dvpp_task_decodes_on_the_cpu(runtime, decoder, caplog):
    data = encode(gradient(240, 320), "JPEG")
    runtime.acl.faults.inject("dvpp", nth=1, code=507000)
    with caplog.at_level(logging.WARNING):
        got = decoder(data, plan(64, 96))
    np.testing.assert_array_equal(got, decoder._fallback(data, plan(64, 96)))
    assert "DVPP decode failed (AclError: acl.rt.synchronize_stream_with_timeout failed with 507000" in caplog.text
    counted = tasks_run(runtime.acl)
    decoder(data, plan(64, 96))  # not given up: the next image is DVPP's again
    assert counted.fired == 2
    assert decoder.outcomes == {dvpp.FAILED: 1, dvpp.DECODED: 1}


def test_a_hung_dvpp_task_gives_dvpp_up_for_the_cpu(runtime, monkeypatch, caplog):
    monkeypatch.setattr(dvpp, "DVPP_WAIT_MS", 200)
    d = dvpp.DvppDecoder(runtime, CpuDecoder(1 << 26, 8192))
    gate = threading.Event()
    data = encode(gradient(240, 320), "JPEG")
    buffers = runtime.acl.media_stats()["buffers"]
    try:
        runtime.acl.faults.inject("dvpp", nth=1, hold=gate)
        with caplog.at_level(logging.ERROR):
            got = d(data, plan(64, 96))
        np.testing.assert_array_equal(got, d._fallback(data, plan(64, 96)))
        assert "a DVPP task did not finish within 200 ms; DVPP is given up" in caplog.text
        assert d._hung
        counted = tasks_run(runtime.acl)
        np.testing.assert_array_equal(d(data, plan(64, 96)), got)
        assert counted.fired == 0  # every image after it decodes on the CPU
        assert d.outcomes == {dvpp.GIVEN_UP: 2}
        d.close()  # the JPEG's and JPEGD's buffers (the hung task's) are left to the chip
        assert runtime.acl.media_stats()["buffers"] == buffers + 2
    finally:
        gate.set()
        d.close()
        runtime.acl.faults.clear()


NO_MEDIA = r'''
import json, sys
from aclserve.images.dvpp import DvppDecoder, DvppError
from aclserve.images.decode import CpuDecoder
from aclserve.runtime import AclRuntime
from tests.images.images_data import encode, gradient
from tests.images.test_images_dvpp import plan
with AclRuntime("cpu") as rt:
    has = hasattr(rt.acl, "media")
    try:
        d = DvppDecoder(rt, CpuDecoder(1 << 26, 8192))
    except DvppError as e:
        said, outcomes = str(e), None
    else:
        d(encode(gradient(64, 64), "JPEG"), plan(32, 32))
        said, outcomes = None, d.outcome_counts()
        d.close()
print(json.dumps({"has": has, "said": said, "outcomes": outcomes}))
'''


def _without(lacks: str) -> dict:
    env = dict(os.environ, ACLSERVE_CPU_LACKS=lacks, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", NO_MEDIA], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_pyacl_without_media_makes_the_decoder_refuse():
    assert _without("media") == {"has": False, "said": "this CANN's pyACL has no acl.media", "outcomes": None}


def test_a_pyacl_without_bytes_to_ptr_decodes_on_dvpp():
    """The decoder gives pyACL the picture's address as an int (bytes_to_ptr, pyACL 6.0's, takes
    bytes only: it needed a copy of the picture), so a pyACL without bytes_to_ptr decodes too."""
    assert _without("util.bytes_to_ptr") == {"has": True, "said": None, "outcomes": {dvpp.DECODED: 1}}


def test_the_decoder_uses_the_dvpp_of_the_device_it_was_given(runtime):
    """images.dvpp_device: the DVPP buffers of an image are on that device while its task runs."""
    if runtime.device_count() < 2:
        pytest.skip("needs two devices (ACLSERVE_CPU_DEVICES=2, set by tests/conftest.py)")
    acl = runtime.acl
    d = dvpp.DvppDecoder(runtime, CpuDecoder(1 << 26, 8192), device_id=1)
    gate = threading.Event()
    held = acl.faults.inject("dvpp", nth=1, hold=gate)
    data = encode(gradient(240, 320), "JPEG")
    before = {k: acl.memory_stats(k)["used"] for k in (0, 1)}
    decoding = threading.Thread(target=d, args=(data, plan(64, 96)))
    try:
        decoding.start()
        assert held.entered.wait(30)  # JPEGD's task runs: the JPEG and its output are allocated
        assert acl.memory_stats(1)["used"] > before[1] and acl.memory_stats(0)["used"] == before[0]
    finally:
        gate.set()
        decoding.join(30)
        d.close()
        acl.faults.clear()
    assert d.outcomes == {dvpp.DECODED: 1}


def test_a_device_that_does_not_exist_refuses_the_decoder(runtime):
    with pytest.raises(dvpp.DvppError, match="device 7 does not exist"):
        dvpp.DvppDecoder(runtime, CpuDecoder(1 << 26, 8192), device_id=7)
