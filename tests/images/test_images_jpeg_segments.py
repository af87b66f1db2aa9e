"""What the header probe reads from a JPEG's marker segments, as Pillow and libjpeg read them:
baseline or not, the EXIF or XMP orientation, how its colours are coded and sampled, frames Pillow
cannot decode; and the caps on segments, scans and EXIF segments by which a small crafted file
cannot hold a decode thread (or the event loop) for seconds."""
from __future__ import annotations

import io
import struct
import warnings

import numpy as np
import pytest
from PIL import Image, ImageOps

from aclserve.images.header import ImageError, exif_orientation, probe

from .images_data import encode, gradient, sampled_jpeg


def test_probe_tells_a_baseline_jpeg_and_its_exif_orientation():
    """What decides whether a chip's JPEG decoder may take it (images/dvpp.py)."""
    from PIL import Image
    pic = gradient(37, 53)
    assert probe(encode(pic, "JPEG")).baseline and not probe(encode(pic, "JPEG", progressive=True)).baseline
    assert not probe(encode(pic, "PNG")).baseline
    for orientation in (1, 3, 6, 8):
        exif = Image.Exif()
        exif[0x0112] = orientation
        assert probe(encode(pic, "JPEG", exif=exif.tobytes())).orientation == orientation
    assert probe(encode(pic, "JPEG")).orientation == 1


@pytest.mark.parametrize("xmp, exif_orientation, expected", [
    (b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>', None, 6),
    (b"<tiff:Orientation>8</tiff:Orientation>", None, 8),
    (b'<rdf:Description tiff:Orientation="6"/>', 3, 3),  # EXIF's comes first
    (b"<rdf:Description/>", None, 1),
])
def test_probe_reads_an_orientation_from_xmp_when_exif_has_none(xmp, exif_orientation, expected):
    """Pillow turns a picture by XMP's tiff:Orientation when EXIF has none; the probe (by which a
    chip's decoder, which would not turn it, is passed over) read EXIF only."""
    from PIL import Image
    exif = Image.Exif()
    if exif_orientation is not None:
        exif[0x0112] = exif_orientation
    kw = {"exif": exif.tobytes()} if exif_orientation is not None else {}
    data = encode(gradient(37, 53), "JPEG", xmp=xmp, **kw)
    assert probe(data).orientation == expected
    assert Image.open(io.BytesIO(data)).getexif().get(0x0112, 1) == expected  # as Pillow reads it


def test_probe_reads_an_orientation_placed_after_the_frame_header():
    """Pillow reads the segments up to the scan; the probe stopped at the frame header."""
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(gradient(37, 53), "JPEG")
    segment = exif.tobytes()  # "Exif\0\0" and the TIFF data
    assert segment.startswith(b"Exif\0\0")
    app1 = b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment
    sos = data.index(b"\xff\xda")
    moved = data[:sos] + app1 + data[sos:]
    assert Image.open(io.BytesIO(moved)).getexif().get(0x0112) == 6
    assert probe(moved).orientation == 6


def test_probe_tells_how_a_jpeg_codes_its_colours():
    """A chip's JPEG decoder takes YCbCr or grey only (pyACL's JPEGD constraints): an RGB-coded
    JPEG (Adobe marker, transform 0) or a CMYK one is told apart, to be decoded on the CPU."""
    from PIL import Image
    pic = gradient(37, 53)
    assert probe(encode(pic, "JPEG")).ycc and probe(encode(gradient(37, 53, channels=1), "JPEG")).ycc
    assert not probe(encode(pic, "JPEG", keep_rgb=True)).ycc  # Adobe APP14, transform 0
    cmyk = io.BytesIO()
    Image.fromarray(pic).convert("CMYK").save(cmyk, "JPEG")
    assert not probe(cmyk.getvalue()).ycc
    assert probe(encode(pic, "PNG")).ycc  # not a JPEG: nothing said


def test_probe_names_how_a_jpeg_is_sampled():
    """A chip's JPEG decoder takes 4:4:4, 4:2:2, 4:2:0, 4:4:0 and grey only (CANN's JPEGD
    constraints): the probe names the subsampling by the frame's sampling factors, so that a
    4:1:1 JPEG (Y 4x1), or one of other factors, is told apart and decoded on the CPU."""
    pic = gradient(48, 64)
    for subsampling, name in ((0, "4:4:4"), (1, "4:2:2"), (2, "4:2:0")):  # Pillow's
        assert probe(encode(pic, "JPEG", subsampling=subsampling)).subsampling == name
    assert probe(encode(gradient(48, 64, channels=1), "JPEG")).subsampling == "4:0:0"
    assert probe(sampled_jpeg(pic, (1, 2))).subsampling == "4:4:0"
    assert probe(sampled_jpeg(pic, (4, 1))).subsampling == "4:1:1"
    segments, rest = _segments(encode(pic, "JPEG", subsampling=0))
    sof = next(bytearray(p) for m, p in segments if m == 0xC0)
    sof[7] = sof[10] = sof[13] = 0x22  # a 4:4:4 spelt 2x2 throughout
    segments = [(m, bytes(sof) if m == 0xC0 else p) for m, p in segments]
    assert probe(_jpeg(segments, rest)).subsampling == "2x2,2x2,2x2"


def _segments(jpeg: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The marker segments before the scan (marker, payload after the length), and the rest."""
    pos, out = 2, []
    while jpeg[pos + 1] != 0xDA:
        marker, (length,) = jpeg[pos + 1], struct.unpack(">H", jpeg[pos + 2:pos + 4])
        out.append((marker, jpeg[pos + 4:pos + 2 + length]))
        pos += 2 + length
    return out, jpeg[pos:]


def _jpeg(segments: list[tuple[int, bytes]], rest: bytes) -> bytes:
    return b"\xff\xd8" + b"".join(b"\xff" + bytes([m]) + struct.pack(">H", len(p) + 2) + p for m, p in segments) + rest


def _with_ids(payload: bytes, ids: bytes) -> bytes:
    """A SOF payload (P, Y, X, Nf, then Nf entries of 3 bytes) with its component ids replaced."""
    entries = bytearray(payload)
    for k, cid in enumerate(ids):
        entries[6 + 3 * k] = cid
    return bytes(entries)


@pytest.mark.parametrize("jfif, adobe, ids, ycc", [
    (True, None, b"\x01\x02\x03", True),
    (True, None, b"RGB", True),  # JFIF says YCbCr whatever the ids (libjpeg)
    (False, 0, b"\x01\x02\x03", False),  # Adobe transform 0: RGB whatever the ids
    (False, 1, b"RGB", True),  # Adobe transform 1: YCbCr
    (False, None, b"RGB", False),  # neither marker: the ids R, G, B say RGB
    (False, None, b"\x01\x02\x03", True),
])
def test_how_three_components_are_coded_follows_libjpeg(jfif, adobe, ids, ycc):
    segments, rest = _segments(encode(gradient(37, 53), "JPEG"))
    segments = [(m, p) for m, p in segments if m not in (0xE0, 0xEE)]  # no JFIF, no Adobe marker
    segments = [(m, _with_ids(p, ids) if m == 0xC0 else p) for m, p in segments]
    if jfif:
        segments.insert(0, (0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"))
    if adobe is not None:
        segments.insert(0, (0xEE, b"Adobe\x00\x64\x00\x00\x00\x00" + bytes([adobe])))
    info = probe(_jpeg(segments, rest))
    assert (info.width, info.height, info.baseline, info.ycc) == (53, 37, True, ycc)


def test_a_jpeg_of_many_segments_before_its_frame_is_refused_at_once():
    """2-byte COM segments, or fill bytes, packed before the frame header: the probe (on the
    server's event loop, to charge the decode) took about 1 s per 8 MB walking them."""
    segments, rest = _segments(encode(gradient(37, 53), "JPEG"))
    assert probe(_jpeg([(0xFE, b"")] * 1000 + segments, rest)).width == 53  # many, yet fewer than the cap
    flood = _jpeg([(0xFE, b"")] * (2 << 20) + segments, rest)  # 8 MB
    with pytest.raises(ImageError, match="more than 1024 segments"):
        probe(flood)
    fill = b"\xff\xd8" + b"\xff" * (1 << 20) + encode(gradient(37, 53), "JPEG")[2:]  # fill bytes before a marker
    assert probe(fill).width == 53 and probe(memoryview(fill)).width == 53  # (skipped by a regex, in C)


def test_a_jpeg_of_many_segments_between_its_frame_and_its_scan_is_refused():
    """After the frame header the probe stopped at 1,024 segments and took the picture, and Pillow
    read every one up to the scan in the decode thread (8 MB of empty comments: 2.2 s), keeping
    those past the probe's count uncharged."""
    picture = encode(gradient(37, 53), "JPEG")
    scan = picture.index(b"\xff\xda")
    assert probe(picture[:scan] + b"\xff\xfe\x00\x02" * 1000 + picture[scan:]).width == 53
    with pytest.raises(ImageError, match="^JPEG has more than 1024 segments before its first scan$"):
        probe(picture[:scan] + b"\xff\xfe\x00\x02" * 1100 + picture[scan:])


def test_a_jpeg_of_more_than_64_scans_is_refused_by_the_probe():
    """The last scan of a progressive JPEG repeated: 94 KB of them (4000 x 4000, 1,000 scans)
    held a decode thread for 11 s and every image request behind it (found by a fuzz of the
    image inputs). Sequential multi-scan JPEGs are counted too; a one-scan baseline is not walked."""
    progressive = encode(gradient(40, 48), "JPEG", progressive=True)
    scans = progressive.count(b"\xff\xda")
    assert 1 < scans < 64 and probe(progressive).progressive
    last = progressive.rindex(b"\xff\xda")

    def with_scans(total: int) -> bytes:
        return progressive[:-2] + progressive[last:-2] * (total - scans) + b"\xff\xd9"
    assert probe(with_scans(64)).width == 48 and probe(memoryview(with_scans(64))).width == 48
    with pytest.raises(ImageError, match="more than 64 scans"):
        probe(with_scans(65))
    baseline = encode(gradient(40, 48), "JPEG")
    assert probe(baseline + b"\xff\xda" * 100).baseline  # bytes after the first scan are not read
    # bytes after the end of the picture (a phone's video, an appended picture) are not its scans
    assert probe(progressive + b"\xff\xda\x00" * 100).progressive  # (refused as 106 scans: a review)


def test_only_the_first_exif_segment_counts_as_pillow_reads_it():
    """A second EXIF segment's Orientation is not the picture's (Pillow, which decodes it, reads
    the first); each one read walked its entries on the event loop (1,000 of 64 KB: 1 s)."""
    from PIL import Image

    def exif(orientation: int | None) -> bytes:
        tags = Image.Exif()
        tags[0x010F] = "camera"
        if orientation is not None:
            tags[0x0112] = orientation
        return tags.tobytes()  # "Exif\0\0" + TIFF
    segments, rest = _segments(encode(gradient(37, 53), "JPEG"))
    picture = _jpeg([(0xE1, exif(None)), (0xE1, exif(6))] + segments, rest)
    assert Image.open(io.BytesIO(picture)).getexif().get(0x0112) is None
    assert probe(picture).orientation == 1
    many = _jpeg([(0xE1, exif(None))] * 15 + [(0xE1, exif(6))] + segments, rest)  # (16 at most: below)
    assert probe(many).orientation == 1
    assert probe(_jpeg([(0xE1, b"XMP data")] + [(0xE1, exif(6))] + segments, rest)).orientation == 6


def test_a_jpeg_of_more_than_16_exif_segments_is_refused():
    """Pillow joins each EXIF segment to those before it, copying them all each time: 1,000 of
    64 KB held a decode thread 29 s and 262 MB (found while charging a picture's metadata)."""
    segments, rest = _segments(encode(gradient(37, 53), "JPEG"))
    exif = b"Exif\0\0" + bytes(0xFFFF - 8)
    assert probe(_jpeg([(0xE1, exif)] * 16 + segments, rest)).width == 53
    with pytest.raises(ImageError, match=r"^JPEG has more than 16 EXIF segments \(Pillow joins each to those "):
        probe(_jpeg([(0xE1, exif)] * 17 + segments, rest))


def test_exif_orientation_reads_both_byte_orders_and_never_fails_on_garbage():
    tiff = b"MM" + struct.pack(">HI", 42, 8) + struct.pack(">H", 1) + struct.pack(">HHIH2x", 0x0112, 3, 1, 6)
    assert exif_orientation(b"Exif\0\0" + tiff) == 6
    tiff = b"II" + struct.pack("<HI", 42, 8) + struct.pack("<H", 1) + struct.pack("<HHIH2x", 0x0112, 3, 1, 9)
    assert exif_orientation(b"Exif\0\0" + tiff) == 1  # out of 1-8
    rng = np.random.default_rng(0)
    for n in range(0, 64):
        for prefix in (b"II", b"MM"):
            assert 1 <= exif_orientation(b"Exif\0\0" + prefix + rng.bytes(n)) <= 8
    assert exif_orientation(b"XMP data") == 1


@pytest.mark.parametrize("kind, count, value", [
    (3, 1, struct.pack("<H", 6)), (3, 2, struct.pack("<HH", 5, 3)), (3, 3, struct.pack("<HHH", 7, 1, 1)),
    (4, 1, struct.pack("<I", 8)), (4, 2, struct.pack("<II", 5, 5)), (6, 1, b"\x06"), (8, 1, struct.pack("<h", 6)),
    (9, 1, struct.pack("<i", -6)), (5, 1, struct.pack("<II", 12, 2)), (5, 1, struct.pack("<II", 13, 2)),
    (5, 1, struct.pack("<II", 6, 0)), (10, 1, struct.pack("<ii", -6, -1)), (11, 1, struct.pack("<f", 6.0)),
    (11, 1, struct.pack("<f", float("nan"))), (12, 1, struct.pack("<d", 7.0)), (1, 1, b"\x06"), (7, 1, b"\x06"),
    (2, 2, b"6\0"), (13, 1, struct.pack("<I", 6)), (16, 1, struct.pack("<Q", 5)), (17, 1, struct.pack("<q", 6)),
    (18, 1, struct.pack("<Q", 6)), (3, 1000, struct.pack("<HHH", 6, 6, 6)),  # (values past the data)
])
def test_exif_orientation_of_any_type_is_read_as_pillow_turns_the_picture(kind, count, value):
    """Pillow turns a picture by the first value of an Orientation of any number type (a LONG,
    a RATIONAL 6/1); the probe read a SHORT only (found by a fuzz of the image inputs), so the DVPP
    decoder, which leaves turned pictures to the CPU, would have taken such a picture unturned."""
    inline = value.ljust(4, b"\0") if len(value) <= 4 else struct.pack("<I", 26)
    tiff = (b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHI", 0x0112, kind, count)
            + inline + struct.pack("<I", 0) + (value if len(value) > 4 else b""))
    data = encode(gradient(10, 20), "JPEG", exif=b"Exif\0\0" + tiff)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns of a tag of more entries than one, or past the data
        with Image.open(io.BytesIO(data)) as im:
            pillow = np.asarray(ImageOps.exif_transpose(im))
            unturned = Image.fromarray(np.asarray(im))
    unturned.getexif()[0x0112] = probe(data).orientation  # turned by what the probe read
    assert np.array_equal(np.asarray(ImageOps.exif_transpose(unturned)), pillow)


def _frame_changed(data: bytes, marker: int | None = None, precision: int | None = None) -> bytes:
    sof = data.index(b"\xff\xc0")
    return (data[:sof + 1] + bytes([marker or 0xC0]) + data[sof + 2:sof + 4] + bytes([precision or 8])
            + data[sof + 5:])


@pytest.mark.parametrize("marker, precision, message", [
    (None, 12, r"^12-bit JPEG is not supported \(8-bit samples only\)$"),
    (None, 16, "^16-bit JPEG is not supported"),
    (0xC2, 12, "^12-bit JPEG is not supported"),  # progressive
    (0xC3, 12, "^12-bit JPEG is not supported"),  # lossless
    (0xC5, None, r"^hierarchical JPEG \(SOF5\) is not supported"),
    (0xCF, None, r"^hierarchical JPEG \(SOF15\) is not supported"),
    (0xCB, None, r"^arithmetic-coded lossless JPEG \(SOF11\) is not supported"),
])
def test_a_jpeg_frame_pillow_cannot_decode_is_named(marker, precision, message):
    """Pillow takes 8-bit samples only and libjpeg no hierarchical frame, nor a lossless one
    coded arithmetically: they said "could not be decoded (cannot identify image file)" or
    "(broken data stream when reading image file)" (an independent tester)."""
    data = _frame_changed(encode(gradient(37, 53), "JPEG"), marker, precision)
    with pytest.raises(ImageError, match=message):
        probe(data)
    for kind in (0xC1, 0xC3, 0xC9):  # extended, lossless, arithmetic-coded (its decode judges the data)
        assert probe(_frame_changed(encode(gradient(37, 53), "JPEG"), kind)).width == 53
    assert probe(_frame_changed(encode(gradient(37, 53), "JPEG"), 0xC3)).lossless
