"""A JPEG's scans counted as libjpeg reads them (images/jpeg_markers.py): segments skipped by their
lengths, entropy-coded data by its FF 00 and restart-marker rules, up to the end of the picture."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from aclserve.images.decode import decode_pixels
from aclserve.images.header import ImageError, probe
from aclserve.images.jpeg_markers import markers_after_first_scan
from aclserve.images.plan import ImagePlan

from .images_data import encode, gradient

PROGRESSIVE = encode(gradient(40, 48), "JPEG", progressive=True)
SCANS = PROGRESSIVE.count(b"\xff\xda")
FIRST, LAST = PROGRESSIVE.index(b"\xff\xda"), PROGRESSIVE.rindex(b"\xff\xda")
END = len(PROGRESSIVE) - 2  # (its end marker)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def _after_first_scan(inserted: bytes, scans: int) -> bytes:
    """PROGRESSIVE with `inserted` right after its first scan's data and its last scan repeated
    to make `scans` in all."""
    second = PROGRESSIVE.index(b"\xff", FIRST + 4 + PROGRESSIVE[FIRST + 3])  # (the first scan's data end)
    while PROGRESSIVE[second + 1] == 0:
        second = PROGRESSIVE.index(b"\xff", second + 2)
    return (PROGRESSIVE[:second] + inserted + PROGRESSIVE[second:END]
            + PROGRESSIVE[LAST:END] * (scans - SCANS) + b"\xff\xd9")


def test_a_comment_holding_the_end_marker_hides_no_scans():
    """A 6-byte comment FF FE 00 04 FF D9 after the first scan ended the count, and any number of
    scans followed: a 140 KB 4000 x 4000 picture of 1,506 held a decode thread 36 s (found by
    tester t88). Segments are skipped by their lengths now, as libjpeg skips them."""
    assert 1 < SCANS < 64
    hiding = _segment(0xFE, b"\xff\xd9")
    assert probe(_after_first_scan(hiding, 64)).progressive
    with pytest.raises(ImageError, match="more than 64 scans"):
        probe(_after_first_scan(hiding, 65))
    with pytest.raises(ImageError, match="more than 64 scans"):
        probe(memoryview(_after_first_scan(hiding, 1500)))


def test_scan_headers_inside_a_segment_are_not_scans():
    """A segment's bytes are skipped, whatever they hold: FF DA in a comment is no scan (it was
    counted as one); libjpeg decodes the picture in its own scans."""
    comment = _segment(0xFE, b"\xff\xda" * 100)
    picture = _after_first_scan(comment, SCANS)
    assert probe(picture).progressive
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(picture))),
                                  np.asarray(Image.open(io.BytesIO(PROGRESSIVE))))


def test_stuffed_bytes_fill_and_restart_markers_are_no_segments():
    """In the entropy-coded data FF 00 is a data byte, FF before a marker is fill, and a restart
    marker (RST0-7) or TEM has no length: the walk looks on for the next marker there, as libjpeg."""
    markers = list(markers_after_first_scan(PROGRESSIVE, FIRST + 2))
    assert markers.count(0xDA) == SCANS - 1
    noise = b"\x12\xff\x00\xff\xff\x00\xff\xd0\x34\xff\xd7\xff\x01\xff\xff\xff"  # then a marker follows
    padded = _after_first_scan(noise, SCANS)
    assert list(markers_after_first_scan(padded, FIRST + 2)) == markers
    # a first segment's length under 2 skips only itself, never backwards; the bytes ending: no marker
    assert list(markers_after_first_scan(b"\x00\x00\xff\xfe\x00\x02\xff\xda\x00\x02", 0)) == [0xFE, 0xDA]
    assert list(markers_after_first_scan(b"\x00\x02\xff", 0)) == []


def test_a_scan_of_more_than_a_window_of_data_is_searched_whole():
    """The search goes a window at a time (4 KB, doubled up to 1 MB): a marker past several
    windows, or straddling two, is found."""
    for size in (4095, 4096, 4097, (1 << 20) * 3 + 5):
        data = b"\x00\x02" + b"\xff\x00" * (size // 2) + b"\xff" * (size % 2 + 1) + _segment(0xFE, b"") + b"\xff\xd9"
        assert list(markers_after_first_scan(data, 0)) == [0xFE]


def test_the_walk_ends_at_the_end_of_the_picture_or_a_second_start():
    """Bytes after the end marker (a phone's video, an appended picture) are not read; nor after
    a second SOI, where libjpeg stops decoding ("two SOI markers"): the scans after it are never
    decoded, and the picture is refused by its decode."""
    assert probe(PROGRESSIVE + PROGRESSIVE[LAST:END] * 100).progressive
    restarted = _after_first_scan(b"\xff\xd8", 100)
    assert probe(restarted).progressive
    plan = ImagePlan("x", 8, 8, 1, "gray", "stretch", 1.0, "area", 0, "NHWC", np.dtype(np.uint8), None, None, -1)
    with pytest.raises(ImageError, match=r"^JPEG could not be decoded \(broken data stream"):
        decode_pixels(restarted, plan, 1 << 30, 16384)


def test_a_jpeg_of_many_segments_after_its_first_scan_is_refused():
    """The walk is in Python on the event loop, a segment at a time: at most 1,024 segments after
    the first scan (4-byte comments packed there: 16 M of them in 64 MB, 1 s of the loop)."""
    assert probe(_after_first_scan(_segment(0xFE, b"") * 1000, SCANS)).progressive
    with pytest.raises(ImageError, match="^JPEG has more than 1024 segments after its first scan$"):
        probe(_after_first_scan(_segment(0xFE, b"") * 1100, SCANS))
