"""A JPEG's or PNG's EXIF Orientation tag, read from its bytes as Pillow reads it (Pillow turns the
picture by it): the probe (header.py) reads it on the event loop, without decoding anything.
Pure functions over bytes.
"""
from __future__ import annotations

import struct

EXIF_HEADER = b"Exif\0\0"  # how an APP1 segment of EXIF data begins (and what Pillow puts before a PNG's eXIf)
_ORIENTATION_TAG = 0x0112


def exif_orientation(segment: bytes) -> int:
    """The Orientation tag (1-8) of an APP1 segment's EXIF data (after its length), 1 when it
    has none or is not EXIF: "Exif\\0\\0", a TIFF header (II or MM, 42, IFD0's offset), then
    IFD0's 12-byte entries (tag, type, count, value or its offset). Orientation is one SHORT,
    but Pillow, which turns the picture, takes the first value of any number type (a LONG, a
    RATIONAL 6/1), so this reads them as it does: the DVPP decoder, which leaves turned
    pictures to the CPU, and the decode's charge go by this."""
    if not segment.startswith(EXIF_HEADER) or len(segment) < 14:
        return 1
    tiff = segment[6:]
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return 1
    (ifd,) = struct.unpack(order + "I", tiff[4:8])
    if ifd + 2 > len(tiff):
        return 1
    (entries,) = struct.unpack(order + "H", tiff[ifd:ifd + 2])
    for i in range(min(entries, (len(tiff) - ifd - 2) // 12)):
        entry = ifd + 2 + 12 * i
        tag, kind, count = struct.unpack(order + "HHI", tiff[entry:entry + 8])
        if tag == _ORIENTATION_TAG:
            return _first_number(tiff, order, kind, count, entry + 8)
    return 1


# TIFF number types Pillow reads an Orientation from (struct format; a rational has two parts):
# SHORT, LONG, RATIONAL, SBYTE, SSHORT, SLONG, SRATIONAL, FLOAT, DOUBLE, IFD, LONG8 (not SLONG8
# nor IFD8: Pillow gives no value for those)
_NUMBER_TYPES = {3: "H", 4: "I", 5: "II", 6: "b", 8: "h", 9: "i", 10: "ii", 11: "f", 12: "d", 13: "I",
                 16: "Q"}


def _first_number(tiff: bytes, order: str, kind: int, count: int, at: int) -> int:
    """The first value of an IFD entry whose value (or its offset) is at `at`, as an orientation:
    a whole number 1-8, else 1 (also when its values run past the data: Pillow skips the tag)."""
    number = _NUMBER_TYPES.get(kind)
    if number is None or count < 1:
        return 1
    fmt = order + number
    size = struct.calcsize(fmt)
    if size * count > 4:  # not inline: an offset from the TIFF header
        (at,) = struct.unpack(order + "I", tiff[at:at + 4])
    if at + size * count > len(tiff):
        return 1
    parts = struct.unpack(fmt, tiff[at:at + size])
    value = parts[0] / parts[1] if len(parts) == 2 and parts[1] else parts[0] if len(parts) == 1 else 0
    return int(value) if 1 <= value <= 8 and value == int(value) else 1  # (NaN and inf fail the range)
