"""A JPEG's decode work, its pixels times its scans as the probe counts them, bounded before it
decodes (header.check_work), under the default images.max_scan_pixels: tester t88's picture (a
239 KB grey 16384 x 2441 JPEG of 64 scans, 2-4 s of a decode thread) is refused; a 12 M pixel
progressive photo passes."""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.config import ImageSettings
from aclserve.images.header import ImageError, check_work, probe

from .images_data import encode, gradient

LIMIT = ImageSettings().max_scan_pixels


def _in_scans(jpeg: bytes, total: int) -> bytes:
    """The progressive `jpeg` with its last scan (a refinement of every coefficient band) repeated
    up to `total` scans: a few bytes each for a flat picture, a pass over all of it each."""
    scans = jpeg.count(b"\xff\xda")
    last = jpeg.rindex(b"\xff\xda")
    return jpeg[:-2] + jpeg[last:-2] * (total - scans) + b"\xff\xd9"


def test_the_testers_picture_of_64_scans_is_refused_naming_its_figures():
    flat = encode(np.zeros((2441, 16384), np.uint8), "JPEG", progressive=True)
    picture = _in_scans(flat, 64)
    assert len(picture) < 300_000
    with pytest.raises(ImageError) as refused:
        check_work(probe(picture), LIMIT)
    assert str(refused.value) == ("JPEG of 16384x2441 pixels in 64 scans is 2,559,574,016 pixels x scans to decode; "
                                  "the limit is 800,000,000 (images.max_scan_pixels: each scan is a pass over the "
                                  "whole picture; a progressive JPEG has about 10)")
    check_work(probe(flat), LIMIT)  # in its own 6 scans: 240 M


def test_a_12_megapixel_progressive_photo_passes_whatever_its_scans():
    photo = encode(np.full((3000, 4000, 3), (90, 140, 60), np.uint8), "JPEG", progressive=True)  # (its scans count)
    assert photo.count(b"\xff\xda") == 10
    check_work(probe(photo), LIMIT)
    assert probe(_in_scans(photo, 64)).scans == 64
    check_work(probe(_in_scans(photo, 64)), LIMIT)  # 768 M


def test_the_probe_counts_the_scans_libjpeg_reads_and_a_one_scan_jpeg_is_bounded_by_its_pixels():
    """Scans hidden behind a comment holding the end-of-image bytes count (they are read); a
    baseline JPEG is one scan."""
    progressive = encode(gradient(100, 100), "JPEG", progressive=True)
    check_work(probe(progressive), 100_000)  # 10 scans: 100,000
    first = progressive.index(b"\xff\xda", progressive.index(b"\xff\xda") + 2)  # (the second scan)
    hidden = progressive[:first] + b"\xff\xfe\x00\x04\xff\xd9" + progressive[first:]
    assert probe(hidden).scans == 10
    more = _in_scans(progressive, 11)
    with pytest.raises(ImageError, match="in 11 scans is 110,000 pixels x scans"):
        check_work(probe(more), 100_000)
    baseline = encode(gradient(100, 100), "JPEG")
    assert probe(baseline).scans == 1
    check_work(probe(baseline), 10_000)
    with pytest.raises(ImageError, match="in 1 scan is 10,000 pixels x scans"):
        check_work(probe(baseline), 9_999)
