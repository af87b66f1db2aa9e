"""What Pillow holds of a picture's metadata is charged with its decode (images/metadata_cost.py,
peak.py), and a picture handed over as a memoryview is read without a copy (decode.py). Uncharged,
8 concurrent 32 x 32 pictures carrying 40 MB of metadata each took 500-700 MB past their model's
charge (found by tester t88)."""
from __future__ import annotations

import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from aclserve.images.decode import decode_pixels
from aclserve.images.header import ImageError, probe
from aclserve.images.peak import decode_peak_bytes
from aclserve.images.plan import ImagePlan

from .images_data import encode, gradient

PLAN = ImagePlan("x", 8, 8, 1, "gray", "stretch", 1.0, "area", 0, "NHWC", np.dtype(np.uint8), None, None, -1)
RANDOM = np.random.default_rng(0).bytes(8 << 20)
PART = 0xFFFF - 2  # a JPEG segment's payload, at most
JPEG = encode(gradient(32, 32, 1), "JPEG")
JPEG = JPEG[:2] + JPEG[4 + JPEG[5]:]  # without its JFIF segment (APP0): no metadata at all
PNG = encode(gradient(32, 32, 1))
IHDR_END = 8 + 25  # the signature, then IHDR


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _exif_directory(size: int) -> bytes:
    """A TIFF block of `size` bytes whose first directory has as many entries as fit (65,535 at
    most), each of its own tag: what Pillow's EXIF reading makes most objects of."""
    entries = min((size - 10) // 12, 0xFFFF)
    table = b"".join(struct.pack("<HHI4s", tag, 3, 2, b"\1\0\2\0") for tag in range(1, entries + 1))
    return (b"II*\0" + struct.pack("<IH", 8, entries) + table).ljust(size, b"\0")


def _jpeg_with(segments: bytes) -> tuple[bytes, bytes]:
    """JPEG with `segments` after its SOI, and JPEG padded after its end to the same length."""
    return JPEG[:2] + segments + JPEG[2:], JPEG + bytes(len(segments))


def _png_with(chunks: bytes) -> tuple[bytes, bytes]:
    """PNG with `chunks` after its IHDR, and PNG padded after its end (IEND) to the same length."""
    return PNG[:IHDR_END] + chunks + PNG[IHDR_END:], PNG + _chunk(b"prVt", bytes(len(chunks) - 12))


def _icc_parts(profile: bytes) -> bytes:
    parts = [profile[k:k + PART - 14] for k in range(0, len(profile), PART - 14)]
    return b"".join(_segment(0xE2, b"ICC_PROFILE\0" + bytes((i + 1, len(parts))) + part)
                    for i, part in enumerate(parts))


def _exif_parts(block: bytes) -> bytes:
    return b"".join(_segment(0xE1, b"Exif\0\0" + block[k:k + PART - 6]) for k in range(0, len(block), PART - 6))


def _png_of_junk_image_data() -> tuple[bytes, bytes]:
    """PNG whose one IDAT chunk goes on 8 MB past the picture's data, then an IDAT chunk of 8 MB
    more: Pillow reads the rest of the first at once once the picture is whole, the second whole."""
    start, end = PNG.index(b"IDAT") - 4, PNG.index(b"IEND") - 4
    (length,) = struct.unpack(">I", PNG[start:start + 4])
    image_data = PNG[start + 8:start + 8 + length]
    chunks = _chunk(b"IDAT", image_data + RANDOM) + _chunk(b"IDAT", RANDOM)
    return PNG[:start] + chunks + PNG[end:], PNG + _chunk(b"prVt", bytes(len(chunks) - length - 12))


def _segments(marker: int) -> bytes:
    return b"".join(_segment(marker, RANDOM[k:k + PART]) for k in range(0, len(RANDOM), PART))


CASES = {
    "JPEG APPn segments": lambda: _jpeg_with(_segments(0xE5)),
    "JPEG comments": lambda: _jpeg_with(_segments(0xFE)),
    "JPEG ICC profile": lambda: _jpeg_with(_icc_parts(RANDOM[:4 << 20])),
    "JPEG EXIF in 13 segments": lambda: _jpeg_with(_exif_parts(_exif_directory(12 * 0xFFFF + 10))),
    "PNG private chunk": lambda: _png_with(_chunk(b"prVt", RANDOM)),
    "PNG eXIf chunk": lambda: _png_with(_chunk(b"eXIf", _exif_directory(12 * 0xFFFF + 10))),
    "PNG image data past the picture": _png_of_junk_image_data,
}


def _traced_peak(data) -> int:
    """What decode_pixels allocates at its peak as tracemalloc sees it (Python's objects and
    numpy's arrays: the metadata Pillow reads; the pictures here are small)."""
    tracemalloc.start()
    try:
        decode_pixels(data, PLAN, 1 << 30, 16384)
    except ImageError:
        pass  # (what it held before it was refused counts the same)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("case", CASES)
def test_the_metadata_pillow_holds_is_charged(case):
    """Against the same picture padded after its end to the same length (Pillow reads the file
    in 64 KB blocks), what decoding it holds more is charged more, and not many times more."""
    picture, plain = CASES[case]()
    held = _traced_peak(picture) - _traced_peak(plain)
    charged = decode_peak_bytes(probe(picture), PLAN) - decode_peak_bytes(probe(plain), PLAN)
    assert 4 << 20 < held <= charged <= 2 * held + (1 << 20), (held, charged)


def test_a_png_icc_profile_is_charged_up_to_its_refusal():
    """An iCCP chunk is read whole, sliced, and inflated up to 1 MB (past it Pillow refuses the
    picture): 4 MB of profile held 14 MB before the refusal."""
    picture, plain = _png_with(_chunk(b"iCCP", b"icc\0\0" + zlib.compress(RANDOM[:4 << 20], 0)))
    with pytest.raises(ImageError, match=r"its ICC profile \(iCCP chunk\) inflates past 1,048,576 bytes"):
        decode_pixels(picture, PLAN, 1 << 30, 16384)
    held = _traced_peak(picture) - _traced_peak(plain)
    charged = decode_peak_bytes(probe(picture), PLAN) - decode_peak_bytes(probe(plain), PLAN)
    assert 12 << 20 < held <= charged <= 2 * held, (held, charged)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_memoryview_is_decoded_without_a_copy_of_the_file(fmt):
    """The binary extension, raw bodies and gRPC's raw contents hand the decode a memoryview,
    which io.BytesIO copied whole: 42 MB more for a 42 MB picture, uncharged (found by tester t88)."""
    picture = (JPEG if fmt == "JPEG" else PNG) + RANDOM  # (bytes after its end: not read)
    body = bytearray(b"header" + picture)  # a slice of a body, as those are
    view = memoryview(body)[6:]
    assert _traced_peak(view) < (1 << 20) and _traced_peak(picture) < (1 << 20)
    expected = decode_pixels(picture, PLAN, 1 << 30, 16384)
    np.testing.assert_array_equal(decode_pixels(view, PLAN, 1 << 30, 16384), expected)
