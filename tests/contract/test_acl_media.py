"""acl.media (DVPP) of the CPU runtime, call by call: pyACL's return shapes and argument kinds,
and what JPEGD and VPC refuse, with the code (at the call, or at synchronize for what the task
finds when it runs). CPU runtime only: the codes of a failed task are the emulation's."""
from __future__ import annotations

import ctypes
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from aclserve.acl import constants as C
from tests import REPO
from tests.images.images_data import encode, gradient, sampled_jpeg

NV12, NV21 = 1, 2
BAD, UNSUPPORTED, TASK_FAILED = C.ACL_ERROR_INVALID_PARAM, C.ACL_ERROR_API_NOT_SUPPORT, C.ACL_ERROR_RT_INTERNAL_ERROR
H2D = C.ACL_MEMCPY_HOST_TO_DEVICE


class Dvpp:
    """A channel and a stream, and DVPP buffers and picture descs given back at close."""

    def __init__(self, acl):
        self.acl, self.media = acl, acl.media
        self.stream, ret = acl.rt.create_stream()
        assert ret == 0
        self.channel = self.media.dvpp_create_channel_desc()
        assert self.channel and self.media.dvpp_create_channel(self.channel) == 0
        self.buffers, self.pics = [], []

    def buffer(self, size: int, data: bytes = b"") -> int:
        ptr, ret = self.media.dvpp_malloc(size)
        assert ret == 0 and ptr
        self.buffers.append(ptr)
        if data:
            ctypes.memmove(ptr, data, len(data))
        return ptr

    def jpeg(self, data: bytes) -> int:
        return self.buffer(len(data), data)

    def pic(self, ptr, size, w, h, ws, hs, fmt=NV12) -> int:
        pic = self.media.dvpp_create_pic_desc()
        self.pics.append(pic)
        for name, value in (("data", ptr), ("size", size), ("format", fmt), ("width", w), ("height", h),
                            ("width_stride", ws), ("height_stride", hs)):
            assert getattr(self.media, f"dvpp_set_pic_desc_{name}")(pic, value) == 0
        return pic

    def out(self, w, h, ws, hs, size=None, fmt=NV12) -> int:
        size = ws * hs * 3 // 2 if size is None else size
        return self.pic(self.buffer(size), size, w, h, ws, hs, fmt)

    def decode(self, data: bytes, out: int) -> int:
        return self.media.dvpp_jpeg_decode_async(self.channel, self.jpeg(data), len(data), out, self.stream)

    def resize(self, src: int, dst: int) -> int:
        config = self.media.dvpp_create_resize_config()
        try:
            return self.media.dvpp_vpc_resize_async(self.channel, src, dst, config, self.stream)
        finally:
            assert self.media.dvpp_destroy_resize_config(config) == 0

    def sync(self) -> int:
        return self.acl.rt.synchronize_stream(self.stream)

    def close(self):
        assert self.sync() == 0
        for pic in self.pics:
            assert self.media.dvpp_destroy_pic_desc(pic) == 0
        for ptr in self.buffers:
            assert self.media.dvpp_free(ptr) == 0
        assert self.media.dvpp_destroy_channel(self.channel) == 0
        assert self.media.dvpp_destroy_channel_desc(self.channel) == 0
        assert self.acl.rt.destroy_stream(self.stream) == 0


@pytest.fixture
def dv(acl, ctx, cpu_only):
    d = Dvpp(acl)
    yield d
    d.close()


JPEG = encode(gradient(240, 320), "JPEG")


def test_return_shapes_and_argument_kinds_are_pyacls(acl, dv):
    media = acl.media
    host = acl.util.bytes_to_ptr(JPEG)
    assert media.dvpp_jpeg_get_image_info(host, len(JPEG)) == (320, 240, 3, 0)
    assert media.dvpp_jpeg_predict_dec_size(host, len(JPEG), NV12) == (384 * 240 * 3 // 2, 0)  # CPU-ORT: 128
    ptr, ret = media.dvpp_malloc(100)
    assert ret == 0 and media.dvpp_free(ptr) == 0
    pic = dv.pic(0, 0, 0, 0, 0, 0)
    assert media.dvpp_set_pic_desc_width(pic, 2 ** 32 + 7) == 0 and media.dvpp_get_pic_desc_width(pic) == 7  # "I"
    for bad_call in (lambda: media.dvpp_set_pic_desc_width(pic, 7.0), lambda: media.dvpp_malloc(1.5),
                     lambda: media.dvpp_jpeg_get_image_info(host)):
        with pytest.raises(TypeError, match="args parse failed"):
            bad_call()
    assert media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(b"not a jpeg"), 10)[-1] != 0


def test_get_image_info_refuses_what_jpegd_does_not_decode(acl):
    """dvpp_jpeg_get_image_info checks that JPEGD decodes the stream and refuses one it does not
    with ACL_ERROR_UNSUPPORTED_JPEG, 148052 (CANN 8.0's page for it; aclError: JPEGD takes
    Huffman-coded sequential YUV JPEGs only): the CPU runtime gave such a JPEG's sides and 0
    (found by a fidelity tester). Baseline YCbCr and grey ones are read as before."""
    pic = gradient(240, 320)
    cmyk = io.BytesIO()
    Image.fromarray(pic).convert("CMYK").save(cmyk, "JPEG")
    arithmetic = bytearray(JPEG)
    arithmetic[JPEG.index(b"\xff\xc0\x00\x11") + 1] = 0xC9  # its frame header says arithmetic-coded (SOF9)
    for data in (encode(pic, "JPEG", progressive=True), bytes(arithmetic), cmyk.getvalue(),
                 encode(pic, "JPEG", keep_rgb=True)):  # the last coded as RGB (Adobe marker, transform 0)
        assert acl.media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(data), len(data)) \
            == (0, 0, 0, C.ACL_ERROR_UNSUPPORTED_JPEG)
    grey = encode(gradient(240, 320, 1), "JPEG")
    assert acl.media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(grey), len(grey)) == (320, 240, 1, 0)
    assert acl.media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(JPEG), len(JPEG)) == (320, 240, 3, 0)


def test_jpegd_decodes_the_subsamplings_cann_names_only(acl, dv):
    """CANN's JPEGD constraints: "444/422/420/400/440" only. The CPU runtime read the coding and
    the colour, not the sampling factors, and decoded a 4:1:1 JPEG (Y 4x1), which JPEGD refuses
    (found by a fidelity tester, t70): dvpp_jpeg_get_image_info refuses it, and other factors
    (Y 4x2), with ACL_ERROR_UNSUPPORTED_JPEG, 148052, and a decode task of it fails; 4:4:0 and
    4:2:2 (Y 1x2, 2x1) decode."""
    pic = gradient(64, 128)
    for luma in ((4, 1), (4, 2)):
        data = sampled_jpeg(pic, luma)
        assert acl.media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(data), len(data)) \
            == (0, 0, 0, C.ACL_ERROR_UNSUPPORTED_JPEG), luma
        out = dv.out(0, 0, 0, 0, size=128 * 64 * 3 // 2)
        assert dv.decode(data, out) == 0  # queued: JPEGD finds it out when it runs
        assert dv.sync() == TASK_FAILED and acl.media.dvpp_get_pic_desc_ret_code(out) == 1
    for luma in ((1, 2), (2, 1)):
        data = sampled_jpeg(pic, luma)
        assert acl.media.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(data), len(data)) == (128, 64, 3, 0)
        out = dv.out(128, 64, 128, 64)
        assert dv.decode(data, out) == 0 and dv.sync() == 0, luma
        assert acl.media.dvpp_get_pic_desc_ret_code(out) == 0


def test_a_channel_desc_is_not_destroyed_while_its_channel_is_open(acl, ctx, cpu_only):
    """CANN 8.x's aclError table returns ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED (148051) for a channel
    description destroyed while its channel is not. The CPU runtime destroyed it, and the open
    channel vanished from media_stats (found by a fidelity tester): now refused, the desc kept,
    and destroyed once its channel is."""
    media = acl.media
    before = acl.media_stats()
    desc = media.dvpp_create_channel_desc()
    assert media.dvpp_create_channel(desc) == 0
    assert media.dvpp_destroy_channel_desc(desc) == C.ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED
    stats = acl.media_stats()
    assert (stats["channel_descs"], stats["channels"]) == (before["channel_descs"] + 1, before["channels"] + 1)
    assert media.dvpp_destroy_channel(desc) == 0
    assert media.dvpp_destroy_channel_desc(desc) == 0
    assert media.dvpp_destroy_channel_desc(desc) == BAD
    assert acl.media_stats() == before


def test_jpegd_writes_nv12_at_its_strides_and_sets_the_desc(acl, dv):
    data = encode(gradient(101, 201), "JPEG")  # odd sides: rounded down to even
    out = dv.out(0, 0, 0, 0, size=256 * 112 * 3 // 2)
    assert dv.decode(data, out) == 0 and dv.sync() == 0
    media = acl.media
    got = [getattr(media, f"dvpp_get_pic_desc_{n}")(out) for n in ("width", "height", "width_stride", "height_stride",
                                                                    "ret_code")]
    assert got == [200, 100, 256, 112, 0]


def test_a_task_takes_the_descriptors_buffer_as_it_was_at_the_call(acl, dv):
    """JPEGD, as VPC: a set_pic_desc_data after the call is not the queued task's."""
    import threading
    size = 384 * 240 * 3 // 2
    first, second = dv.buffer(size), dv.buffer(size)
    out = dv.pic(first, size, 320, 240, 384, 240)
    gate = threading.Event()
    acl.faults.inject("dvpp", nth=1, hold=gate, code=0)
    try:
        assert dv.decode(JPEG, out) == 0
        assert acl.media.dvpp_set_pic_desc_data(out, second) == 0
    finally:
        gate.set()
        acl.faults.clear()
    assert dv.sync() == 0
    assert any(ctypes.string_at(first, 384 * 240)) and not any(ctypes.string_at(second, size))


def test_input_not_in_dvpp_memory_is_refused(acl, dv, device_buffer):
    plain = device_buffer(len(JPEG))
    assert acl.rt.memcpy(plain, len(JPEG), acl.util.bytes_to_ptr(JPEG), len(JPEG), H2D) == 0
    out = dv.out(320, 240, 384, 240)
    assert acl.media.dvpp_jpeg_decode_async(dv.channel, plain, len(JPEG), out, dv.stream) == BAD
    assert acl.media.dvpp_free(plain) == BAD  # not dvpp_malloc's
    src = dv.pic(plain, 384 * 240 * 3 // 2, 320, 240, 384, 240)
    assert dv.resize(src, dv.out(160, 120, 160, 120)) == BAD


def test_jpegd_refusals(acl, dv):
    assert dv.decode(JPEG, dv.out(320, 240, 320, 240)) == BAD  # width stride not 128-aligned
    assert dv.decode(JPEG, dv.out(320, 240, 384, 248)) == BAD  # height stride not 16-aligned
    assert dv.decode(JPEG, dv.out(320, 240, 384, 240, fmt=NV21)) == UNSUPPORTED
    for data, size in ((JPEG, 384 * 240 * 3 // 2 - 1),  # under stride_w * stride_h * 3/2
                       (encode(gradient(240, 320)), None),  # PNG
                       (encode(gradient(240, 320), "JPEG", progressive=True), None),
                       (encode(gradient(16, 64), "JPEG"), None),  # under 32 a side
                       (encode(gradient(40, 9000), "JPEG"), None)):  # over 8192
        out = dv.out(0, 0, 0, 0, size=size or 9088 * 48 * 3 // 2)
        assert dv.decode(data, out) == 0  # queued: JPEGD finds it out when it runs
        assert dv.sync() == TASK_FAILED
        assert acl.media.dvpp_get_pic_desc_ret_code(out) == 1


def nv12_in(dv, w=320, h=240):
    out = dv.out(w, h, (w + 127) // 128 * 128, (h + 15) // 16 * 16)
    assert dv.decode(encode(gradient(h, w), "JPEG"), out) == 0 and dv.sync() == 0
    return out


def test_vpc_refusals(acl, dv):
    src = nv12_in(dv)
    assert dv.resize(src, dv.out(160, 120, 160, 120)) == 0 and dv.sync() == 0
    assert dv.resize(src, dv.out(160, 120, 168, 120)) == BAD  # width stride not 16-aligned
    assert dv.resize(src, dv.out(160, 120, 160, 121)) == BAD  # height stride odd
    assert dv.resize(src, dv.out(160, 120, 160, 120, size=160 * 120 * 3 // 2 - 1)) == BAD
    assert dv.resize(src, dv.out(8, 8, 16, 8)) == BAD  # under the smallest output, 10 x 6
    assert dv.resize(src, dv.out(12, 12, 16, 12)) == BAD  # width stride under VPC's 32 (CANN's constraints)
    assert dv.resize(src, dv.out(12, 12, 32, 12)) == 0 and dv.sync() == 0
    assert dv.resize(src, dv.out(4608, 240, 4608, 240)) == BAD  # over 4096 wide
    assert dv.resize(src, dv.out(160, 120, 160, 120, fmt=NV21)) == UNSUPPORTED
    assert dv.resize(src, dv.out(161, 120, 176, 120)) == BAD  # odd output width (NV12)
    assert dv.resize(src, dv.out(160, 119, 160, 120)) == BAD  # odd output height
    odd = dv.pic(acl.media.dvpp_get_pic_desc_data(src), 384 * 240 * 3 // 2, 319, 239, 384, 240)
    assert dv.resize(odd, dv.out(160, 120, 160, 120)) == BAD  # odd input sides (NV12 input: even)
    small = nv12_in(dv, 64, 64)
    assert dv.resize(small, dv.out(1040, 64, 1040, 64)) == BAD  # 16.25x: over VPC's 16
    big = nv12_in(dv, 4000, 64)
    assert dv.resize(big, dv.out(112, 64, 112, 64)) == BAD  # 1/35.7: under VPC's 1/32


_DVPP_BY_SOC = textwrap.dedent("""
    import json
    from aclserve.acl import select
    from tests.contract.test_acl_media import JPEG, Dvpp, nv12_in
    _, acl = select("cpu")
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    dv = Dvpp(acl)
    src = nv12_in(dv, 320, 480)
    print(json.dumps({"soc": acl.get_soc_name(), "4224": dv.resize(src, dv.out(64, 4224, 64, 4224)),
                      "4096": dv.resize(src, dv.out(64, 4096, 64, 4096)),
                      "stride 320": dv.decode(JPEG, dv.out(320, 240, 320, 240))}))  # 64-aligned, not 128
    dv.close()
""")


def test_vpc_output_height_and_jpegd_stride_follow_the_soc(cpu_only):
    """CANN's VPC constraints: output up to 4096 x 4096 on the Ascend310P (and 310, training
    series), 4096 x 8192 on the 310B, A2 and A3; JPEGD's: a width stride aligned to 128 on the 310
    and training series, to 64 on the others. The training series' Ascend910B, taken for an A2
    (Ascend910B1..B4) by its name's beginning, had the A2's. Each SoC in a process of its own: the
    CPU runtime presents ACLSERVE_CPU_SOC's, read when ACL starts."""
    expected = {"CPU-ORT": (BAD, BAD), "Ascend310P3": (BAD, 0), "Ascend310": (BAD, BAD), "Ascend910B": (BAD, BAD),
                "Ascend910B2": (0, 0), "Ascend910B4": (0, 0), "Ascend310B1": (0, 0)}
    runs = {soc: subprocess.Popen([sys.executable, "-c", _DVPP_BY_SOC], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=dict(os.environ, ACLSERVE_CPU_SOC=soc))
            for soc in expected}
    for soc, (tall, stride_64) in expected.items():
        out, err = runs[soc].communicate(timeout=120)
        assert runs[soc].returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"soc": soc, "4224": tall, "4096": 0,
                                                             "stride 320": stride_64}
