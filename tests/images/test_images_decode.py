"""Decoding one image and fitting it to a plan (Pillow on the CPU): sizes, crops and letterboxes,
modes, EXIF orientation; broken, mutated and truncated files refused as image errors saying why;
Pillow's own pixel limit."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from aclserve.images.decode import CpuDecoder, decode_pixels
from aclserve.images.header import ImageError
from .image_plans import LIMITS, plan
from .images_data import encode, gradient, lossless_jpeg, white_bilevel_png


def test_stretch_gives_model_size_in_colour_order():
    pic = gradient(40, 60)
    rgb = decode_pixels(encode(pic), plan(20, 30), *LIMITS)
    bgr = decode_pixels(encode(pic), plan(20, 30, color="bgr"), *LIMITS)
    assert rgb.shape == (20, 30, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(bgr, rgb[:, :, ::-1])
    # the same as Pillow's own antialiased resize of the decoded picture
    expected = np.asarray(Image.fromarray(pic).resize((30, 20), Image.BILINEAR))
    np.testing.assert_array_equal(rgb, expected)


def test_center_crop_and_letterbox():
    pic = np.zeros((40, 80, 3), np.uint8)
    pic[:, :15] = 255  # a white band at the left edge
    crop = decode_pixels(encode(pic), plan(20, 20, resize="center_crop"), *LIMITS)
    assert crop.shape == (20, 20, 3) and crop.max() == 0  # the centre square misses the band
    boxed = plan(20, 20, resize="letterbox", pad_value=7)
    inside = decode_pixels(encode(pic), boxed, *LIMITS)
    box = boxed.to_row(inside)
    assert inside.shape == (10, 20, 3) and box.shape == (20, 20, 3)
    assert (box[:5] == 7).all() and (box[15:] == 7).all()  # 80x40 fits as 20x10, padded above and below
    assert box[5:15, :3].min() > 200 and box[5:15, 5:].max() == 0


def test_center_crop_of_the_whole_side_takes_every_size():
    """crop_fraction 1.0 (the default): the box's side came out a hair past the picture's for
    2-8 % of sizes (an independent tester's sweep: 98x99, 98x106, 99x98 to 64x64), and Pillow
    refused its negative offset, a 400 saying the picture could not be decoded."""
    for w, h in ((98, 99), (98, 106), (99, 98), (640, 427)):
        pic = np.full((h, w, 3), 90, np.uint8)
        out = decode_pixels(encode(pic, "PNG"), plan(64, 64, resize="center_crop", crop_fraction=1.0), *LIMITS)
        assert out.shape == (64, 64, 3) and (out == 90).all(), (w, h)


def test_grey_alpha_sixteen_bit_and_palette():
    grey = decode_pixels(encode(gradient(16, 16)), plan(16, 16, 1), *LIMITS)
    assert grey.shape == (16, 16, 1)
    rgba = np.dstack([gradient(16, 16), np.full((16, 16), 3, np.uint8)])
    np.testing.assert_array_equal(decode_pixels(encode(rgba), plan(16, 16, resize="stretch"), *LIMITS),
                                  gradient(16, 16))  # alpha dropped, colours kept
    deep = (np.arange(256, dtype=np.uint16).reshape(16, 16) * 257)
    buf = io.BytesIO()
    Image.fromarray(deep).save(buf, "PNG")  # 16-bit grey
    np.testing.assert_array_equal(decode_pixels(buf.getvalue(), plan(16, 16, 1), *LIMITS)[:, :, 0],
                                  np.arange(256).reshape(16, 16))
    buf = io.BytesIO()
    Image.fromarray(gradient(16, 16)).convert("P").save(buf, "PNG")
    assert decode_pixels(buf.getvalue(), plan(16, 16), *LIMITS).shape == (16, 16, 3)


@pytest.mark.parametrize("fmt, options", [("JPEG", {"quality": 95}), ("PNG", {})])  # PNG's was ignored
def test_exif_orientation_is_applied(fmt, options):
    pic = np.zeros((20, 40, 3), np.uint8)
    pic[:10, :20] = 255  # stored: white top-left quadrant
    im = Image.fromarray(pic)
    exif = im.getexif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    buf = io.BytesIO()
    im.save(buf, fmt, exif=exif.tobytes(), **options)
    out = decode_pixels(buf.getvalue(), plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_malformed_exif_block_still_turns_the_picture(fmt):
    """Orientation 6 beside a Make tag (ASCII in TIFF) stored as a RATIONAL: Pillow's
    exif_transpose writes the block back and raised AttributeError (a 500 to the client)."""
    ifd = struct.pack("<H", 2) + struct.pack("<HHII", 0x010F, 5, 1, 8 + 2 + 24 + 4)
    ifd += struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack("<I", 0)
    exif = b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<II", 1, 1)
    pic = np.zeros((20, 40, 3), np.uint8)
    pic[:10, :20] = 255  # stored: white top-left quadrant
    buf = io.BytesIO()
    Image.fromarray(pic).save(buf, fmt, exif=exif if fmt == "JPEG" else exif[6:])
    out = decode_pixels(buf.getvalue(), plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:len(d) // 2], r"^PNG could not be decoded \(image file is truncated"),  # (not "its EXIF")
    (lambda d: d[:40] + bytes(len(d) - 40), r"PNG is truncated \(or corrupt\) before its image data"),
])
def test_broken_images_say_so(mutate, message):
    data = mutate(encode(gradient(64, 64)))
    with pytest.raises(ImageError, match=message):
        decode_pixels(data, plan(8, 8), *LIMITS)


def test_a_decoder_message_says_why_and_names_no_object_of_the_server():
    """A PNG whose chunk before the image data fails its CRC check: Pillow "cannot identify image
    file <_io.BytesIO object at 0x...>", an address of the server's (found by an independent
    soak), and no reason (an independent tester); said with Pillow's reason, without it."""
    data = encode(gradient(32, 32))
    text = b"tEXt" + b"k\0v"
    data = data[:33] + struct.pack(">I", 3) + text + bytes(4) + data[33:]  # a tEXt chunk, its CRC zero
    with pytest.raises(ImageError) as e:
        decode_pixels(data, plan(8, 8), *LIMITS)
    assert str(e.value) == "PNG could not be decoded (broken PNG file (bad header checksum in b'tEXt'))"


@pytest.mark.parametrize("chunk, named", [
    (b"iCCP" + b"icc\0\0", "its ICC profile (iCCP chunk)"),
    (b"zTXt" + b"exif\0\0", "a zTXt text chunk"),  # (one Pillow reads an orientation from: still given to it)
], ids=["ICC profile", "zTXt"])
def test_a_chunk_inflating_past_pillows_cap_is_named(chunk, named):
    """Pillow refuses a PNG whose ICC profile inflates past 1 MB saying only "Decompressed data
    too large for PngImagePlugin.MAX_TEXT_CHUNK" (found by tester t88): the chunk is named."""
    payload = chunk[4:] + zlib.compress(bytes(2 << 20))
    data = encode(gradient(32, 32))
    data = data[:33] + struct.pack(">I", len(payload)) + chunk[:4] + payload + struct.pack(
        ">I", zlib.crc32(chunk[:4] + payload)) + data[33:]
    with pytest.raises(ImageError) as e:
        decode_pixels(memoryview(data), plan(8, 8), *LIMITS)
    assert str(e.value) == (f"PNG could not be decoded ({named} inflates past 1,048,576 bytes, Pillow's "
                            f"PngImagePlugin.MAX_TEXT_CHUNK)")


def test_a_lossless_jpeg_decodes_at_full_size():
    """libjpeg (libjpeg-turbo 3, in Pillow's wheels) decodes a lossless JPEG but cannot scale
    it: the draft asked for a smaller target made it "could not be decoded (broken data stream
    when reading image file)"."""
    grey = gradient(48, 64, 1)
    data = lossless_jpeg(grey)
    want = np.asarray(Image.fromarray(grey).convert("RGB").resize((16, 12), Image.BILINEAR))
    assert (decode_pixels(data, plan(12, 16), *LIMITS) == want).all()
    assert (decode_pixels(data, plan(12, 16, 1, color="gray"), *LIMITS)[:, :, 0]
            == np.asarray(Image.fromarray(grey).resize((16, 12), Image.BILINEAR))).all()


def test_mutated_images_fail_only_with_image_error():
    """Random byte changes and cuts in JPEGs (with EXIF) and PNGs: every failure is an
    ImageError (a 400 with its message), never another exception (a 500)."""
    rng = np.random.default_rng(5)
    im = Image.fromarray(gradient(40, 50))
    exif = im.getexif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    im.save(buf, "JPEG", exif=exif.tobytes())
    png = io.BytesIO()
    im.save(png, "PNG", exif=exif.tobytes())
    seeds = [buf.getvalue(), encode(gradient(40, 50)), encode(gradient(40, 50), "JPEG", progressive=True),
             encode(gradient(30, 30, 1)), png.getvalue()]
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(600):
        data = bytearray(seeds[rng.integers(len(seeds))])
        for _ in range(rng.integers(1, 7)):
            data[rng.integers(len(data))] = rng.integers(256)
        if rng.random() < 0.2:
            data = data[:rng.integers(len(data))]
        try:
            decode_pixels(bytes(data), plan(16, 16), *LIMITS)
            outcomes["decoded"] += 1
        except ImageError:
            outcomes["refused"] += 1
    assert outcomes["decoded"] and outcomes["refused"]


def test_truncated_jpeg_is_refused():
    data = encode(gradient(64, 64), "JPEG")
    in_image_data = (data.index(b"\xff\xda") + len(data)) // 2
    with pytest.raises(ImageError, match="JPEG could not be decoded"):
        decode_pixels(data[:in_image_data], plan(8, 8), *LIMITS)
    with pytest.raises(ImageError, match="^JPEG is truncated before its image data$"):  # cut in its headers
        decode_pixels(data[:len(data) // 3], plan(8, 8), *LIMITS)


def test_images_max_pixels_above_pillow_s_own_limit_is_the_limit(monkeypatch):
    """Pillow refuses by itself a picture of over twice Image.MAX_IMAGE_PIXELS (179 M pixels by
    default): with images.max_pixels at 400 M, a 1-bit PNG of 13400 x 13400 (179.6 M) was a 400
    "PNG is too large to decode", naming neither limit (an independent tester)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # Pillow's default, whatever ran before
    data = white_bilevel_png(13400, 13400)
    decoder = CpuDecoder(400_000_000, 16384)
    assert (decoder(data, plan(8, 8, 1, interpolation="area")) == 255).all()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # lowered since: said so
    with pytest.raises(ImageError, match=r"PNG of 179,560,000 pixels is over Pillow's own limit .* images.max_pixels"):
        decoder(data, plan(8, 8, 1))
