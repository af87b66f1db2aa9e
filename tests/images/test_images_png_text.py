"""A PNG's text chunks are taken out before Pillow reads the file (images/png_text.py), but for
those it takes an orientation from: the pixels are Pillow's, the text is not inflated."""
from __future__ import annotations

import io
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

from aclserve.images.decode import decode_pixels
from aclserve.images.header import ImageError, probe
from aclserve.images.png_text import MAX_TEXT_CHUNK, text_chunks, without_text
from .images_data import _chunk, encode, gradient
from .image_plans import LIMITS, plan

MEGABYTE_OF_TEXT = zlib.compress(b"a" * ((1 << 20) - 100), 9)  # 1 KB inflating to 1 MB


def _with_chunks(png: bytes, before: list[bytes], after: list[bytes] = ()) -> bytes:
    """`png` with chunks put after its IHDR and before its IEND."""
    iend = png.rindex(b"IEND") - 4
    return png[:33] + b"".join(before) + png[33:iend] + b"".join(after) + png[iend:]


def _traced_peak(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_text_chunks_are_not_inflated_and_the_pixels_are_the_same():
    """60 zTXt chunks inflating to 1 MB each in a 63 KB PNG held a decode thread 0.5-0.7 s and
    60 MB (found by an independent tester), compressed iTXt ones after the image data alike:
    decoded now without reading them, the pixels those of the same PNG without them."""
    png = encode(gradient(64, 64))
    data = _with_chunks(png, [_chunk(b"zTXt", b"k%d\0\0" % i + MEGABYTE_OF_TEXT) for i in range(50)],
                        [_chunk(b"iTXt", b"t%d\0\x01\0\0\0" % i + MEGABYTE_OF_TEXT) for i in range(10)])
    assert len(data) < 100_000 and len(Image.open(io.BytesIO(data)).text) == 60  # Pillow's own reading
    got = []
    peak = _traced_peak(lambda: got.append(decode_pixels(data, plan(16, 16), *LIMITS)))
    assert peak < 1 << 20  # (64 MB with the text inflated)
    np.testing.assert_array_equal(got[0], decode_pixels(png, plan(16, 16), *LIMITS))


def _quadrant() -> Image.Image:
    pic = np.zeros((20, 40, 3), np.uint8)
    pic[:10, :20] = 255  # stored: white top-left quadrant
    return Image.fromarray(pic)


def _raw_profile(orientation: int) -> bytes:
    """ImageMagick's zTXt of EXIF: its name, length, then the bytes in hex (Pillow reads it)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    hexed = exif.tobytes().hex()
    return b"Raw profile type exif\0\0" + zlib.compress(f"\nexif\n{len(hexed) // 2:8d}\n{hexed}\n".encode())


def _xmp(orientation: int) -> bytes:
    return b'XML:com.adobe.xmp\0\0\0\0\0<x:xmpmeta><rdf:Description tiff:Orientation="%d"/></x:xmpmeta>' % orientation


@pytest.mark.parametrize("chunks", [
    [_chunk(b"zTXt", _raw_profile(6))],
    [_chunk(b"iTXt", _xmp(3)), _chunk(b"zTXt", b"k\0\0" + MEGABYTE_OF_TEXT), _chunk(b"iTXt", _xmp(6))],  # the last
], ids=["raw profile", "xmp"])
def test_text_pillow_takes_an_orientation_from_still_turns_the_picture(chunks):
    """Pillow turns a PNG by the EXIF of ImageMagick's "Raw profile type exif" zTXt, or by XMP
    (the last chunk of each kind read): those chunks are still given to it."""
    data = _with_chunks(encode(np.asarray(_quadrant())), chunks)
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6  # Pillow's own reading
    out = decode_pixels(data, plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right


def test_what_is_taken_out():
    """Nothing to take out: the bytes themselves, no copy. Else each text chunk but those of a
    keyword Pillow takes an orientation from, and one before the image data that fails its CRC
    check (Pillow refuses the picture for it: test_images_decode)."""
    png = encode(gradient(8, 8))
    assert without_text(png) is png
    kept = [_chunk(b"iTXt", _xmp(1)), _chunk(b"zTXt", _raw_profile(6)), _chunk(b"iTXt", _xmp(6)),
            _chunk(b"tEXt", b"xmp\0<x/>"), _chunk(b"tEXt", b"exif")]  # (a keyword without a NUL is all the data)
    broken = _chunk(b"tEXt", b"k\0v")[:-4] + bytes(4)
    data = _with_chunks(png, [kept[0], kept[1], broken, _chunk(b"tEXt", b"Software\0x"), _chunk(b"tEXt", b"exif2")],
                        [_chunk(b"tEXt", b"late\0y"), *kept[2:], _chunk(b"zTXt", b"xmpx\0\0")])
    assert without_text(data) == _with_chunks(png, [kept[0], kept[1], broken], kept[2:])
    assert len(text_chunks(without_text(data))) == 6


@pytest.mark.parametrize("unread", [
    b"XML:com.adobe.xmp\0\0\0\0\0\xff\xfe not UTF-8",
    b"XML:com.adobe.xmp\0\1\1\0\0x",  # compressed by a method Pillow does not know
    b"XML:com.adobe.xmp\0\1\0\0\0not deflate",
], ids=["not utf-8", "unknown method", "corrupt"])
def test_an_orientation_stays_when_a_later_chunk_of_its_keyword_is_not_read(unread):
    """Pillow reads an XMP orientation of 6 when a later XMP iTXt cannot be read: it sets
    nothing, the earlier chunk's value stays. The decode kept only the last chunk of each type
    and keyword, and gave the picture upright (found by a reviewer)."""
    data = _with_chunks(encode(np.asarray(_quadrant())), [_chunk(b"iTXt", _xmp(6)), _chunk(b"iTXt", unread)])
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6  # Pillow's own reading
    out = decode_pixels(data, plan(40, 20), *LIMITS)  # displayed 20 wide, 40 high
    assert out[:20, 10:].mean() > 200 and out[:20, :10].mean() < 50  # now top-right
    assert probe(data).may_turn


def test_a_png_of_more_orientation_text_chunks_than_8_is_refused():
    """Every chunk of a keyword Pillow takes an orientation from is given to it, so their
    number is bounded: the 60 zTXt chunks inflating to 1 MB each, named "exif", are refused by
    the probe, before any is inflated; 8 are taken and charged their inflated text."""
    png = encode(gradient(8, 8))
    bombs = [_chunk(b"zTXt", b"exif\0\0" + MEGABYTE_OF_TEXT)] * 60
    with pytest.raises(ImageError, match=r"more than 8 text chunks of a keyword an orientation is read from "
                                         r"\(Raw profile type exif, XML:com.adobe.xmp, exif, xmp\)"):
        probe(_with_chunks(png, bombs))
    eight = _with_chunks(png, [_chunk(b"zTXt", b"XML:com.adobe.xmp\0\0" + MEGABYTE_OF_TEXT)] * 8)
    assert probe(eight).text_bytes >= 8 * MAX_TEXT_CHUNK
    np.testing.assert_array_equal(decode_pixels(eight, plan(8, 8), *LIMITS), decode_pixels(png, plan(8, 8), *LIMITS))


def _split_image_data(png: bytes, between: bytes) -> bytes:
    """`png` with its one IDAT chunk cut in two and `between` put between the halves."""
    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at:at + 4], "big")
    rows = png[at + 8:at + 8 + length]
    return (png[:at] + _chunk(b"IDAT", rows[:length // 2]) + between + _chunk(b"IDAT", rows[length // 2:])
            + png[at + 12 + length:])


@pytest.mark.parametrize("where, text", [
    ("before", _chunk(b"zTXt", b"k\0\1x")),  # compressed by an unknown method
    ("before", _chunk(b"iTXt", b"k\0\1\0\0\0" + zlib.compress(b"a" * (2 << 20)))),  # inflating past 1 MB
    ("between", _chunk(b"tEXt", b"k\0v")),
], ids=["unknown method", "past 1 MB", "between IDAT chunks"])
def test_a_png_pillow_refuses_for_a_text_chunk_it_is_not_given_decodes(where, text):
    """As README says: Pillow refuses these PNGs for a text chunk, which the decode takes out;
    they decode to the pixels of the PNG without it."""
    png = encode(gradient(64, 64))
    data = _with_chunks(png, [text]) if where == "before" else _split_image_data(png, text)
    with pytest.raises((SyntaxError, ValueError, OSError)):  # (UnidentifiedImageError is an OSError)
        Image.open(io.BytesIO(data)).load()
    np.testing.assert_array_equal(decode_pixels(data, plan(16, 16), *LIMITS), decode_pixels(png, plan(16, 16), *LIMITS))


class _CountedSlices(bytes):
    """A file's bytes that count the slices (copies) taken of them."""

    def __getitem__(self, key):
        if isinstance(key, slice):
            self.slices = getattr(self, "slices", 0) + 1
        return super().__getitem__(key)


def test_the_probe_copies_nothing_a_chunk():
    """The probe, on the event loop, copied every text chunk's keyword twice and every eXIf
    chunk's data (up to 64 KB), though it reads only the first: a 64 MB PNG of text chunks took
    3.5 times as long, 1,000 eXIf chunks of 64 KB 20 times (found by a reviewer). It copies as
    much of a PNG of 200 such chunks as of one of each."""
    png = encode(gradient(8, 8))
    exif, comment = _chunk(b"eXIf", b"MM\0*" + bytes(4096)), _chunk(b"tEXt", b"Comment\0" + bytes(100))
    oriented = [_chunk(b"zTXt", _raw_profile(6)), _chunk(b"iTXt", _xmp(6)), _chunk(b"tEXt", b"exif\0x")]

    def slices(before, after):
        data = _CountedSlices(_with_chunks(png, before, after))
        assert probe(data).may_turn
        return data.slices
    assert slices([exif, comment], oriented) == slices([exif, comment] * 100, oriented)


@pytest.mark.parametrize("chunk", [
    _chunk(b"zTXt", b"exif\0\0" + zlib.compress(b"hello")),
    _chunk(b"iTXt", b"exif\0\0\0\0\0hello"),
    _chunk(b"zTXt", b"xmp\0\0" + zlib.compress(b"hello")),
    _chunk(b"tEXt", b"exif\0hello"),
], ids=["zTXt exif", "iTXt exif", "zTXt xmp", "tEXt exif"])
def test_a_png_whose_orientation_text_pillow_cannot_read_is_refused_as_malformed(chunk):
    """A compressed or international text chunk named "exif" or "xmp" is text where Pillow's
    EXIF reading wants bytes: it raised TypeError, which reached the client as a 500 (found by
    a helper); a tEXt one was refused already. Each is now a malformed picture."""
    data = _with_chunks(encode(gradient(8, 8)), [chunk])
    with pytest.raises(ImageError, match=r"^PNG could not be decoded \(its EXIF, where its orientation is read, "
                                         r"is malformed: "):
        decode_pixels(data, plan(8, 8), *LIMITS)
