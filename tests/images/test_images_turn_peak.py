"""A picture the decode turns or flips (its EXIF orientation) is charged the whole copy
Image.transpose makes of it (images/peak.py TURN_BYTES), and the probe says which pictures may
be turned: a JPEG by its EXIF or XMP, a PNG by its eXIf chunk or a text chunk Pillow reads one
from. Measured in a child process as its peak resident size (VmHWM, reset before the decode:
what this test process allocated before would otherwise hide it): a figure of memory, not a
time."""
from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from aclserve.images.decode import draft_scale, jpeg_draft_request
from aclserve.images.header import probe
from aclserve.images.peak import TURN_BYTES, decode_peak_bytes
from aclserve.images.plan import ImagePlan
from tests import REPO
from .images_data import _chunk, encode, gradient

SIDE = 2000

_CHILD = """
import sys
import numpy as np
from aclserve.images.decode import decode_pixels
from aclserve.images.header import probe
from aclserve.images.peak import decode_peak_bytes
from aclserve.images.plan import ImagePlan
def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
with open(sys.argv[1], "rb") as f:
    data = f.read()
target = ImagePlan("x", 64, 64, 3, "rgb", "stretch", 1.0, sys.argv[2], 0, "NHWC", np.dtype(np.uint8), None, None, -1)
charge = decode_peak_bytes(probe(data), target)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size from here on
before = peak()
decode_pixels(data, target, 1 << 30, 65535)
print(peak() - before, charge)
"""


def plan(interpolation: str) -> ImagePlan:
    return ImagePlan("x", 64, 64, 3, "rgb", "stretch", 1.0, interpolation, 0, "NHWC", np.dtype(np.uint8), None,
                     None, -1)


def _with_orientation(fmt: str, orientation: int) -> bytes:
    """A SIDE x SIDE photo-like picture (noise enlarged: PNG cannot pack it small) of that EXIF orientation."""
    small = np.random.default_rng(0).integers(0, 255, (SIDE // 8, SIDE // 8, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(small).resize((SIDE, SIDE), Image.BILINEAR).save(
        buf, fmt, exif=exif.tobytes(), **({"compress_level": 1} if fmt == "PNG" else {"quality": 90}))
    return buf.getvalue()


@pytest.mark.parametrize("fmt, interpolation", [("PNG", "bilinear"), ("JPEG", "nearest")])  # (nearest: whole)
def test_a_turned_picture_is_charged_the_copy_its_turn_makes(tmp_path, fmt, interpolation):
    """A 3000 x 3000 RGB PNG of orientation 6 peaked at 68.9-69.3 MiB where 68.7 were charged:
    its decode holds the picture and its turned copy, 8 bytes a pixel, the whole charge, before
    anything else (found by an independent tester). Now the copy is charged besides."""
    upright, turned = (probe(_with_orientation(fmt, o)) for o in (1, 6))
    assert turned.may_turn and not upright.may_turn
    request = jpeg_draft_request(SIDE, SIDE, 6, plan(interpolation))
    decoded = SIDE * SIDE if fmt == "PNG" else (SIDE // draft_scale(SIDE, SIDE, request)) ** 2
    assert decode_peak_bytes(turned, plan(interpolation)) - decode_peak_bytes(upright, plan(interpolation)) \
        == decoded * 4 == decoded * TURN_BYTES  # (the copy in Pillow's RGB: 4 bytes a pixel)
    path = tmp_path / f"turned.{fmt.lower()}"
    path.write_bytes(_with_orientation(fmt, 6))
    child = subprocess.run([sys.executable, "-c", _CHILD, str(path), interpolation], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
    assert child.returncode == 0, child.stderr
    peak, charge = map(int, child.stdout.split())
    assert charge >= peak > SIDE * SIDE * 7, (peak, charge)  # (it did hold the picture and its copy)


def test_which_pngs_may_be_turned():
    """Pillow turns a PNG by its eXIf chunk (the probe reads one, of 64 KB at most: a second one,
    or a larger one, may turn it) or by a text chunk it takes an orientation from (its value is
    not read: compressed, it would be inflated on the event loop)."""
    png = encode(gradient(8, 8))

    def exif_chunk(orientation: int) -> bytes:
        exif = Image.Exif()
        exif[0x0112] = orientation
        return _chunk(b"eXIf", exif.tobytes()[6:])
    with_chunks = lambda *chunks: png[:33] + b"".join(chunks) + png[33:]  # noqa: E731 (after IHDR)
    assert not probe(png).may_turn and not probe(with_chunks(exif_chunk(1))).may_turn
    assert probe(with_chunks(exif_chunk(8))).may_turn
    assert probe(with_chunks(exif_chunk(1), exif_chunk(1))).may_turn
    assert probe(with_chunks(_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0<x/>"))).may_turn
    assert not probe(with_chunks(_chunk(b"tEXt", b"Software\0x"))).may_turn
