"""What decoding a picture is charged (images/peak.py): the size libjpeg really decodes a JPEG
to, what a progressive JPEG and an alpha PNG hold besides; and a request's decode charge held
until its decodes end, also when the request is cancelled while they run (server/images.py)."""
from __future__ import annotations

import asyncio
import gc
import io
import struct
import threading
import tracemalloc
import weakref
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from aclserve.config import ImageSettings
from aclserve.images.decode import decode_pixels, draft_scale, jpeg_draft_request
from aclserve.images.header import probe
from aclserve.images.peak import (COEFFICIENT_BYTES, JPEG_DRAFT_BYTES, JPEG_FULL_BYTES, PNG_ALPHA_BYTES,
                                  PNG_BYTES, decode_peak_bytes, target_pixel_bytes)
from aclserve.images.plan import ImagePlan
from aclserve.images.pool import DecodePool
from aclserve.images.stage import ImageStage
from aclserve.server.budget import MemoryBudget
from aclserve.server.images import ImageDecoding

from .images_data import encode, gradient, lossless_jpeg


def plan(width: int, height: int, resize: str = "stretch") -> ImagePlan:
    return ImagePlan("x", height, width, 3, "rgb", resize, 0.875, "bilinear", 0, "NHWC", np.dtype(np.uint8),
                     None, None, -1)


@pytest.mark.parametrize("size,target,resize,orientation", [
    ((1603, 1201), (224, 224), "stretch", 1),     # 1/2: 1201 // (224 x 1.5, the margin) = 3
    ((1603, 1201), (64, 48), "stretch", 1),       # 1/8
    ((1603, 1201), (100, 90), "center_crop", 1),  # 1/4
    ((1603, 1201), (900, 700), "stretch", 1),     # 1/1
    ((1603, 1201), (350, 250), "letterbox", 1),   # 1/2
    ((1603, 801), (224, 400), "stretch", 6),      # turned: the target's sides swap before the draft
])
def test_the_charged_draft_is_the_size_libjpeg_decodes_to(size, target, resize, orientation):
    """Pillow's Image.draft (libjpeg's 1/1-1/8 scaling), asked as decode_pixels asks it."""
    w, h = size
    request = jpeg_draft_request(w, h, orientation, plan(*target, resize))
    im = Image.open(io.BytesIO(encode(gradient(h, w), "JPEG")))
    im.draft("RGB", request)
    scale = draft_scale(w, h, request)
    assert im.size == (-(-w // scale), -(-h // scale))


def test_a_jpeg_for_a_nearest_input_is_charged_its_full_size():
    """nearest takes single pixels, which libjpeg's scaling would average: such a JPEG decodes
    whole (decode.jpeg_draft_request), and is charged so, not at 1/8."""
    w, h = 1603, 1201
    nearest = replace(plan(64, 48), interpolation="nearest")
    request = jpeg_draft_request(w, h, 1, nearest)
    im = Image.open(io.BytesIO(encode(gradient(h, w), "JPEG")))
    im.draft("RGB", request)
    assert draft_scale(w, h, request) == 1 and im.size == (w, h)
    info = probe(encode(gradient(h, w), "JPEG", quality=90))
    assert decode_peak_bytes(info, nearest) == int(w * h * (JPEG_DRAFT_BYTES + JPEG_FULL_BYTES)
                                                   + 64 * 48 * target_pixel_bytes(nearest)) + info.metadata_bytes


def test_a_lossless_jpeg_is_charged_its_full_size():
    """libjpeg cannot scale a lossless JPEG while decoding: it decodes whole (decode_pixels asks
    no draft), and was charged as scaled to 1/2."""
    info = probe(lossless_jpeg(gradient(1200, 1600, 1)))
    assert info.lossless
    assert decode_peak_bytes(info, plan(224, 224)) == int(1600 * 1200 * (JPEG_DRAFT_BYTES + JPEG_FULL_BYTES)
                                                         + 224 * 224 * target_pixel_bytes(plan(224, 224)))


def test_a_baseline_jpeg_is_charged_its_draft_and_a_progressive_one_its_coefficients():
    pic = gradient(1200, 1600)
    small = plan(224, 224)
    full = 1600 * 1200
    target = 224 * 224 * target_pixel_bytes(plan(224, 224))
    baseline = probe(encode(pic, "JPEG", quality=90))  # 4:2:0
    drafted = 800 * 600  # 1/2 a side (1200 // (224 x 1.5) = 3)
    assert decode_peak_bytes(baseline, small) == (int(drafted * JPEG_DRAFT_BYTES + full * JPEG_FULL_BYTES) + target
                                                  + baseline.metadata_bytes)  # (its JFIF segment: metadata_cost.py)
    for subsampling, samples in ((0, 3.0), (2, 1.5)):  # 4:4:4, 4:2:0
        info = probe(encode(pic, "JPEG", quality=90, progressive=True, subsampling=subsampling))
        assert info.progressive and info.samples_per_pixel == samples
        assert (decode_peak_bytes(info, small) - decode_peak_bytes(baseline, small)
                == int(full * samples * COEFFICIENT_BYTES))
    grey = probe(encode(pic[:, :, 0], "JPEG", progressive=True))
    assert grey.samples_per_pixel == 1.0


@pytest.mark.parametrize("mode,alpha", [("L", False), ("RGB", False), ("LA", True), ("RGBA", True), ("P", True)])
def test_a_png_is_charged_whole_and_more_when_it_decodes_through_rgba(mode, alpha):
    pic = Image.new(mode, (300, 200))
    buf = io.BytesIO()
    pic.save(buf, "PNG")
    info = probe(buf.getvalue())
    assert info.alpha is alpha
    per_pixel = PNG_ALPHA_BYTES if alpha else PNG_BYTES
    assert decode_peak_bytes(info, plan(8, 8)) == (300 * 200 * per_pixel + 8 * 8 * target_pixel_bytes(plan(8, 8))
                                                   + info.metadata_bytes)  # (its IHDR and IDAT: metadata_cost.py)


def _decode_peak(data: bytes, target) -> int:
    """What decode_pixels allocates at its peak, as tracemalloc sees it (Pillow's text and
    numpy's arrays, not Pillow's pixels: the pictures here are of one pixel)."""
    tracemalloc.start()
    try:
        decode_pixels(data, target, 1 << 30, 16384)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_png_is_charged_what_its_text_chunks_cost_its_decode():
    """60 zTXt chunks inflating to 1 MB each in a 63 KB picture of one pixel: Pillow kept 60 MB
    of text per decode, charged nothing (found by a fuzz of the image inputs); they are taken out
    before it reads the file now (png_text.py), and what is charged is the copy without them and
    the reading of one, not their 60 MB."""
    text = PngImagePlugin.PngInfo()
    for k in range(60):
        text.add_text(f"k{k}", "a" * (1 << 20), zip=True)
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG", pnginfo=text)
    info = probe(buf.getvalue())
    assert len(buf.getvalue()) < 100_000 and info.text_bytes < 8 << 20
    target = 8 * 8 * target_pixel_bytes(plan(8, 8))
    assert decode_peak_bytes(info, plan(8, 8)) == PNG_BYTES + info.text_bytes + target + info.metadata_bytes
    assert decode_peak_bytes(info, plan(8, 8)) >= _decode_peak(buf.getvalue(), plan(8, 8))


@pytest.mark.parametrize("keyword", ["k", "XML:com.adobe.xmp"])  # taken out; given to Pillow (an orientation's)
@pytest.mark.parametrize("kind", ["tEXt", "iTXt"])
def test_a_png_is_charged_the_peak_of_reading_an_uncompressed_text_chunk(kind, keyword):
    """Pillow caps what a compressed text chunk inflates to, not an uncompressed one, and holds
    copies while reading it: a 40 MB tEXt was charged 1 MB (found by a review). One it is still
    given is read, and charged so; one taken out is not read."""
    text = PngImagePlugin.PngInfo()
    if kind == "tEXt":
        text.add_text(keyword, "a" * (8 << 20))
    else:
        text.add_itxt(keyword, "a" * (8 << 20), zip=False)
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG", pnginfo=text)
    data = buf.getvalue()
    peak = _decode_peak(data, plan(8, 8))
    assert decode_peak_bytes(probe(data), plan(8, 8)) >= peak
    assert peak > 8 << 20 if keyword != "k" else peak < 1 << 20


class _CpuRuntime:
    kind = "cpu"


def test_a_cancelled_request_keeps_its_decode_charge_until_its_decodes_end():
    """Its client gone, the request ends at once; the decode it began runs on in the pool's
    thread, holding its memory, which stays charged until it ends (found by an independent
    review: it was given back at the cancellation)."""
    png = encode(np.zeros((2000, 2000), np.uint8))
    stage = ImageStage({"x": plan(8, 8)})
    images = ImageDecoding(ImageSettings(workers=2), _CpuRuntime())
    entered, release = threading.Event(), threading.Event()
    decode = images.decode

    def held_decode(data, picture_plan):  # a decode that takes as long as the test says
        entered.set()
        release.wait(30)
        return decode(data, picture_plan)
    images.decode = held_decode
    charge = (2000 * 2000 * PNG_BYTES + 8 * 8 * target_pixel_bytes(plan(8, 8)) + plan(8, 8).row_bytes
              + probe(png).metadata_bytes)

    async def main():
        budget = MemoryBudget(1 << 30, 1 << 30)
        with budget.lease() as lease:
            task = asyncio.ensure_future(images.prepare(stage, {"x": [png]}, lease))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            assert budget.used == charge
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and images.pool.pending == 1
        assert budget.used == charge  # the request's lease is gone, the decode's charge (and its row's) is not
        release.set()
        while images.pool.pending:
            await asyncio.sleep(0.01)
        assert budget.used == 0
    try:
        asyncio.run(main())
    finally:
        release.set()
        images.close()



def test_a_cancelled_requests_queued_decodes_let_go_of_their_rows_at_once():
    """A job cancelled before it began holds the row of the request's tensor it was to write:
    it is let go with the cancellation, not when a thread takes the job off the executor's
    queue after the decodes queued before it (which may be other requests' long ones)."""
    pool = DecodePool(workers=1, max_pending=4)
    started, gate = threading.Event(), threading.Event()

    def held(row):
        started.set()
        return gate.wait(30)

    async def main():
        rows = [np.zeros(4), np.zeros(4)]
        queued_row = weakref.ref(rows[1])
        task = asyncio.ensure_future(pool.map(held, rows))
        del rows
        while not started.is_set():  # the first job runs (held by the gate), the second is queued
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert pool.pending == 1  # the first still runs
        return queued_row
    try:
        queued_row = asyncio.run(main())
        gc.collect()  # (the cancellation's traceback and the frames it holds)
        assert queued_row() is None
    finally:
        gate.set()
        pool.close()

def _sequential_in_three_scans(width: int, height: int) -> bytes:
    """A baseline (SOF0) mid-grey JPEG, 4:4:4, each component in a scan of its own (legal, and
    what jpegtran -scans writes): every block a DC difference of 0 ("00") and an EOB ("1010")."""
    segments, _ = _segments_of(encode(np.full((16, 16, 3), 128, np.uint8), "JPEG", subsampling=0))
    tables = b"".join(_segment(m, body) for m, body in segments if m in (0xDB, 0xC4))
    frame = struct.pack(">BHHB", 8, height, width, 3) + b"".join(bytes([i, 0x11, 0]) for i in (1, 2, 3))
    bits = "001010" * (-(-width // 8) * -(-height // 8))
    bits += "1" * (-len(bits) % 8)
    entropy = int(bits, 2).to_bytes(len(bits) // 8, "big")
    scans = b"".join(_segment(0xDA, bytes([1, i, 0, 0, 63, 0])) + entropy for i in (1, 2, 3))
    return (b"\xff\xd8" + _segment(0xE0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0") + _segment(0xC0, frame) + tables
            + scans + b"\xff\xd9")


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def _segments_of(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    pos, out = 2, []
    while True:
        marker, (length,) = data[pos + 1], struct.unpack(">H", data[pos + 2:pos + 4])
        out.append((marker, data[pos + 4:pos + 2 + length]))
        if marker == 0xDA:
            return out, data[pos + 2 + length:]
        pos += 2 + length


def test_a_sequential_jpeg_in_several_scans_is_charged_its_coefficients_too():
    """libjpeg keeps every DCT coefficient when the first scan lacks a component, progressive or
    not: a 6000 x 6000 one for a 224 x 224 target took 209 MiB while charged 13 MiB (found by an
    independent review); one scan of all components keeps none."""
    data = _sequential_in_three_scans(64, 48)
    assert np.asarray(Image.open(io.BytesIO(data))).tolist() == np.full((48, 64, 3), 128).tolist()
    info = probe(data)
    assert info.baseline and not info.progressive and info.buffered
    assert decode_peak_bytes(info, plan(8, 8)) - decode_peak_bytes(probe(encode(gradient(48, 64), "JPEG",
                                                                                subsampling=0)), plan(8, 8)) \
        == int(64 * 48 * 3 * COEFFICIENT_BYTES)
    assert not probe(encode(gradient(48, 64), "JPEG")).buffered
    assert probe(encode(gradient(48, 64), "JPEG", progressive=True)).buffered
