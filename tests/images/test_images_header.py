"""Header probing and decompression limits: what the probe reads of any picture (its size; whether
tensor bytes are a picture file), what it refuses (other formats, headers cut short or corrupt),
bombs refused by the size their header announces with nothing of that size allocated (checked
under an address-space limit in a subprocess), and PNGs of many small chunks. What it reads from a
JPEG's marker segments, and their caps: test_images_jpeg_segments.py."""
from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from aclserve.images.header import ImageError, check_size, picture_file, probe
from tests import REPO

from .images_data import encode, gradient, jpeg_bomb, png_bomb


def test_probe_reads_size_of_jpeg_and_png():
    pic = gradient(37, 53)
    for fmt, kw in (("PNG", {}), ("JPEG", {"quality": 80}), ("JPEG", {"progressive": True})):
        info = probe(encode(pic, fmt, **kw))
        assert (info.format, info.width, info.height) == (fmt, 53, 37)


def test_a_picture_file_is_told_from_tensor_bytes_that_begin_like_one():
    """picture_file, for tensor bytes (server/stray_pictures.py): PNG by its 8-byte signature,
    JPEG by FF D8 FF and a header that reads; those 3 bytes alone are a pixel (255, 216, 255)."""
    pic = gradient(20, 24)
    jpeg = encode(pic, "JPEG")
    assert picture_file(encode(pic)) == "PNG" and picture_file(b"\x89PNG\r\n\x1a\n") == "PNG"
    assert picture_file(jpeg) == picture_file(encode(pic, "JPEG", progressive=True)) == "JPEG"
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    pixels[0, 0] = (255, 216, 255)
    jfif_start = bytearray(pixels.tobytes())
    jfif_start[:20] = jpeg[:20]  # SOI and a whole APP0 segment, then no marker
    for data in (pixels.tobytes(), bytes(jfif_start), jpeg[:len(jpeg) // 3], encode(pic, "GIF"), b"\x89PNG", b""):
        assert picture_file(data) is None, data[:8]


@pytest.mark.parametrize("data, message", [
    (b"", "empty image"),
    (b"GIF89a" + b"\0" * 20, "GIF images are not accepted"),
    (b"RIFF\0\0\0\0WEBPVP8 ", "WebP images are not accepted"),
    (b"hello world, not an image", "not a JPEG or PNG image"),
    # base64 text sent where the file's bytes go (tritonclient sends BYTES binary by default)
    (base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10JFIF"), "base64 text of an image, not its file's bytes"),
    (base64.b64encode(b"\x89PNG\r\n\x1a\n\0\0"), "base64 text of an image"),
    (b"data:image/png;base64,iVBORw0KGgo=", "base64 text of an image"),
    (b"\x89PNG\r\n\x1a\n\0\0", "PNG is truncated"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG is truncated before its frame header"),
    # a phone's photo, an AVIF (also when its major brand is only mif1), a JP2: were "not a JPEG or PNG image"
    (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(40), r"HEIF \(HEIC\) images are not accepted"),
    (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + bytes(40), "AVIF images are not accepted"),
    (b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avifmiaf" + bytes(40), "AVIF images are not accepted"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(40), "JPEG 2000 images are not accepted"),
])
def test_probe_refuses_other_things(data, message):
    with pytest.raises(ImageError, match=message):
        probe(data)


def test_an_mp4_is_not_taken_for_a_picture_format():
    with pytest.raises(ImageError, match="^not a JPEG or PNG image$"):
        probe(b"\x00\x00\x00\x1cftypisom\x00\x00\x02\x00isomiso2mp41" + bytes(40))


def test_headers_cut_short_or_corrupt_are_named():
    """What Pillow answered "cannot identify image file" (an independent tester): a JPEG cut in
    or right after its scan header, a PNG cut in its IHDR header or before its image data, one
    whose IHDR fails its CRC check, one without image data."""
    jpeg, png = encode(gradient(37, 53), "JPEG"), encode(gradient(37, 53))
    sos = jpeg.index(b"\xff\xda")
    for cut in (sos + 2, sos + 5, sos + 14):  # after the marker, in the header, at its end
        with pytest.raises(ImageError, match="^JPEG is truncated before its image data$"):
            probe(jpeg[:cut])
    with pytest.raises(ImageError, match="^JPEG is truncated before its image data$"):
        probe(jpeg[:jpeg.index(b"\xff\xc4")])  # after the frame header, before the tables
    assert probe(jpeg[:sos + 15]).width == 53  # image data begun: its decode says where it stops
    for cut in (24, 30, 32):
        with pytest.raises(ImageError, match=r"^PNG is truncated \(it ends in its IHDR header\)$"):
            probe(png[:cut])
    with pytest.raises(ImageError, match=r"^PNG is corrupt \(its IHDR header fails its CRC check\)$"):
        probe(png[:29] + bytes(4) + png[33:])
    for cut in (33, 40):
        with pytest.raises(ImageError, match=r"^PNG is truncated \(or corrupt\) before its image data$"):
            probe(png[:cut])
    with pytest.raises(ImageError, match=r"^PNG has no image data \(IDAT chunk\)$"):
        probe(png[:33] + png[png.rindex(b"IEND") - 4:])


def test_bombs_are_refused_by_their_header():
    for bomb in (png_bomb(), jpeg_bomb()):
        assert len(bomb) < 1000
        info = probe(bomb)
        assert (info.width, info.height) == (60000, 60000)
        with pytest.raises(ImageError, match=r"announces 60000x60000 pixels; the limit is 40,000,000"):
            check_size(info, 40_000_000, 16384)
    with pytest.raises(ImageError, match="limit"):
        check_size(probe(png_bomb(20000, 10)), 40_000_000, 16384)  # one side too long
    check_size(probe(png_bomb(4000, 4000)), 40_000_000, 16384)  # within both limits


def test_bomb_is_refused_without_allocating_it():
    """Under an address-space limit of the process size + 256 MiB, the decoder refuses the
    60,000 x 60,000 PNG and JPEG with its own message (so nothing of 10.8 GB was reserved: an
    attempt would have raised MemoryError), while a plain allocation of that size does fail."""
    code = textwrap.dedent("""
        import resource, sys
        import numpy as np
        sys.path.insert(0, "tests/images")
        from images_data import jpeg_bomb, png_bomb
        from aclserve.images.decode import decode_pixels
        from aclserve.images.header import ImageError
        from aclserve.images.plan import build_plan
        from aclserve.config import ImageInput
        from aclserve.runtime.types import TensorSpec
        plan = build_plan(ImageInput(), TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, 32, 32, 3), "NHWC"))
        size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, resource.RLIM_INFINITY))
        for bomb in (png_bomb(), jpeg_bomb()):
            try:
                decode_pixels(bomb, plan, 40_000_000, 16384)
            except ImageError as e:
                print("refused:", e)
        try:
            np.empty(60000 * 60000 * 3, np.uint8)
        except MemoryError:
            print("a real allocation fails under the limit")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused: PNG header announces 60000x60000 pixels")
    assert lines[1].startswith("refused: JPEG header announces 60000x60000 pixels")
    assert lines[2] == "a real allocation fails under the limit"


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def test_a_png_of_many_small_chunks_is_refused_by_the_probe():
    """Pillow reads each chunk in Python: 500,000 empty text chunks (6 MB) held a decode thread
    0.86 s before the image data, 0.69 s after it, 500,000 empty IDAT chunks 0.29 s. A real PNG
    has a few small chunks besides its image data; 1,024 still pass, and image data in chunks of
    4 KB or more is not counted; in smaller ones, 1,024 and one per 256 bytes of the file."""
    png = encode(gradient(20, 30), "PNG")
    ihdr_end = 8 + 25  # signature, then IHDR (length, type, 13 bytes, CRC)
    iend = png.rindex(b"IEND") - 4
    text = _chunk(b"tEXt", b"k\0v")
    assert probe(png[:ihdr_end] + text * (1024 - 2) + png[ihdr_end:]).width == 30  # IHDR, IEND besides
    for flood in (png[:ihdr_end] + text * 2000 + png[ihdr_end:], png[:iend] + text * 2000 + png[iend:]):
        with pytest.raises(ImageError, match="^PNG has more than 1024 chunks of under 4096 bytes besides its image"):
            probe(flood)
    empty = _chunk(b"IDAT", b"")
    padded = png[:ihdr_end] + _chunk(b"prVt", bytes(256 * 2000)) + png[ihdr_end:iend]  # a private chunk
    size = len(padded) + len(png[iend:])  # and 12 bytes an empty chunk; the picture's own IDAT counts too
    most = max(count for count in range(5000) if count + 1 <= 1024 + (size + 12 * count) // 256)
    assert most > 2900 and probe(padded + empty * most + png[iend:]).width == 30
    with pytest.raises(ImageError, match=r"^PNG has more than [0-9,]+ image data \(IDAT\) chunks of under 4096 "
                                         r"bytes \(1,024 and one per 256 bytes of the file\)$"):
        probe(padded + empty * (most + 1) + png[iend:])
    with pytest.raises(ImageError, match="image data"):
        probe(png[:iend] + empty * 2000 + png[iend:])


def test_what_follows_a_pngs_end_is_not_walked():
    """Pillow reads nothing after IEND: a PNG followed by 20,000 zero bytes (which read as empty
    chunks) decodes, and was refused as "more than 1024 chunks of under 4096 bytes" (found by
    tester t88); text chunks after it are not Pillow's either."""
    from aclserve.images.decode import decode_pixels
    from aclserve.images.plan import ImagePlan
    png = encode(gradient(20, 30))
    plan = ImagePlan("x", 20, 30, 3, "rgb", "stretch", 1.0, "bilinear", 0, "NHWC", np.dtype(np.uint8), None,
                     None, -1)
    expected = decode_pixels(png, plan, 1 << 30, 16384)
    for padded in (png + bytes(20_000), png + _chunk(b"zTXt", b"exif\0\0" + zlib.compress(b"x")) * 2000):
        assert probe(padded).width == 30 and not probe(padded).may_turn
        np.testing.assert_array_equal(decode_pixels(padded, plan, 1 << 30, 16384), expected)


def test_a_streaming_encoders_png_of_one_idat_chunk_a_row_decodes():
    """One IDAT chunk per row, flushed as it is written (1,201 for a 1000 x 1200 photo of 2.4 MB,
    an independent tester's): refused as "more than 1024 chunks of under 4096 bytes"."""
    from aclserve.images.decode import decode_pixels
    from aclserve.images.plan import ImagePlan
    pixels = gradient(1100, 200)
    deflate, rows = zlib.compressobj(), []
    for row in pixels:
        rows.append(_chunk(b"IDAT", deflate.compress(b"\0" + row.tobytes()) + deflate.flush(zlib.Z_SYNC_FLUSH)))
    png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 200, 1100, 8, 2, 0, 0, 0))
           + b"".join(rows) + _chunk(b"IDAT", deflate.flush()) + _chunk(b"IEND", b""))
    assert png.count(b"IDAT") == 1101 and max(len(r) for r in rows) < 4096
    assert probe(png).height == 1100
    plan = ImagePlan("x", 1100, 200, 3, "rgb", "stretch", 1.0, "bilinear", 0, "NHWC", np.dtype(np.uint8), None,
                     None, -1)
    assert (decode_pixels(png, plan, 40_000_000, 16384) == pixels).all()
    zeros = zlib.compress(bytes(3 * 2000 * 2000 + 2000))
    large = _chunk(b"IHDR", struct.pack(">IIBBBBB", 2000, 2000, 8, 2, 0, 0, 0)) + b"".join(
        _chunk(b"IDAT", zeros[k:k + 4096]) for k in range(0, len(zeros), 4096)) + _chunk(b"IEND", b"")
    assert probe(b"\x89PNG\r\n\x1a\n" + large).width == 2000  # its data in 4 KB chunks: not counted
