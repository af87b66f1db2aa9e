"""Pillow's warnings about a client's picture, filtered for the decode threads without touching
the process's warnings state from them (images/decode.py, ignore_pillow_notes). pytest.ini
makes every warning an error, so a Pillow warning let through fails these tests, and so does
one of ours filtered by a decode."""
from __future__ import annotations

import struct
import threading
import time
import warnings

import numpy as np
import pytest

from aclserve.config import ImageInput
from aclserve.images.decode import decode_pixels
from aclserve.images.plan import build_plan
from aclserve.runtime.types import TensorSpec

from .images_data import encode, gradient

LIMITS = (40_000_000, 16384)
PLAN = build_plan(ImageInput(), TensorSpec("x", "UINT8", np.dtype(np.uint8), (-1, 64, 64, 3), "NHWC"))


def _exif_past_its_data() -> bytes:
    """A JPEG whose EXIF Orientation claims 1,000 values, past the block: Pillow warns "Tag data
    larger than file" reading it (from PIL.TiffImagePlugin)."""
    tiff = (b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHI", 0x0112, 3, 1000)
            + struct.pack("<I", 26) + struct.pack("<I", 0) + struct.pack("<HHH", 6, 6, 6))
    return encode(gradient(40, 50), "JPEG", exif=b"Exif\0\0" + tiff)


def test_pillows_notes_on_a_picture_are_filtered_and_no_other_warning_is():
    pixels = decode_pixels(_exif_past_its_data(), PLAN, *LIMITS)  # (pytest: the warning would raise)
    assert pixels.shape == (64, 64, 3)
    with pytest.raises(UserWarning, match="not Pillow's"):
        warnings.warn("not Pillow's")


def test_decodes_in_several_threads_leave_the_process_warnings_filters_alone():
    """Each decode swapped warnings.filters for a copy with "ignore" in front and put back what
    it had found (warnings.catch_warnings): a decode ending while another ran put back a list
    with the other's "ignore", and every warning of the process was silenced from then on. The
    decodes here overlap (a barrier starts them together, Pillow decodes without the GIL), and
    the main thread looks at the process's list and showwarning meanwhile."""
    png = encode(gradient(1000, 1000))
    decode_pixels(png, PLAN, *LIMITS)  # the filter is put in the list by the first decode
    filters, shown, listed = warnings.filters, warnings.showwarning, list(warnings.filters)
    start = threading.Barrier(4)
    failures = []

    def decodes():
        try:
            start.wait(30)
            for data in (png, _exif_past_its_data()) * 4:
                decode_pixels(data, PLAN, *LIMITS)
        except Exception as e:  # (a warning raised as an error included)
            failures.append(e)
    threads = [threading.Thread(target=decodes) for _ in range(4)]
    for thread in threads:
        thread.start()
    swapped = 0
    while any(thread.is_alive() for thread in threads):
        swapped += warnings.filters is not filters or warnings.showwarning is not shown
        time.sleep(0)  # (let the decode threads take the GIL)
    for thread in threads:
        thread.join()
    assert not failures
    assert swapped == 0
    assert warnings.filters is filters and warnings.filters == listed and warnings.showwarning is shown
    with pytest.raises(UserWarning, match="still an error"):
        warnings.warn("still an error")
