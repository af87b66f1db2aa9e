"""A PNG's text chunks (tEXt, zTXt, iTXt): which of them the decode gives Pillow, and what they
cost it at its peak.

Nothing of the server reads a picture's text, but Pillow reads every text chunk it is given and
inflates the compressed ones (up to PIL.PngImagePlugin.MAX_TEXT_CHUNK, 1 MB, each): 60 zTXt
chunks in a 63 KB PNG held a decode thread 0.5-0.7 s (found by an independent tester). Its caps
are module settings, the process's (the Engine API is a library: its program may use Pillow
too), so the decode takes the chunks out of the file instead (without_text), all but those
Pillow would act on: every chunk of a keyword Pillow reads an orientation from (Image.getexif:
a "Raw profile type exif" chunk, XMP, an "exif" one), which turns the picture, and a chunk
before the image data failing its CRC check, for which Pillow refuses the picture. Of the
first, a PNG may have MAX_ORIENTATION_TEXTS (header.probe refuses more).
Pure functions over bytes.
"""
from __future__ import annotations

import re
import struct
import zlib

from PIL import PngImagePlugin

TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
# keywords Pillow takes an orientation from (PIL.Image.Exif, getexif's XMP search)
ORIENTATION_KEYWORDS = frozenset((b"Raw profile type exif", b"XML:com.adobe.xmp", b"xmp", b"exif"))
# ... matched where it lies, ending at the chunk data's first NUL or its end (Pillow reads a
# keyword up to the first NUL, or the whole data when it has none): no copy of each keyword, on
# the event loop (copying each one, twice, made the probe of 64 MB of text chunks 3x slower)
_ORIENTATION_KEYWORD = re.compile(b"(" + b"|".join(map(re.escape, ORIENTATION_KEYWORDS)) + rb")(?:\0|\Z)")
CHUNK_HEAD = struct.Struct(">I4s")  # a PNG chunk's length and type (header.py's walk reads it too)
# Chunks of those keywords a PNG may have (real ones have one or two: ImageMagick's raw EXIF
# profile, Adobe's XMP): all are given to Pillow, and each inflates to 1 MB at most, so the 60
# zTXt chunks above cannot come back named "exif"
MAX_ORIENTATION_TEXTS = 8
# Pillow's caps on text (a compressed chunk inflates to at most MAX_TEXT_CHUNK, deflate at most
# 1,032-fold; all it keeps, MAX_TEXT_MEMORY), and what reading one chunk holds besides what it
# keeps: up to 5 times its text (an uncompressed iTXt, measured; a tEXt 3 times)
MAX_TEXT_CHUNK, MAX_TEXT_MEMORY = PngImagePlugin.MAX_TEXT_CHUNK, PngImagePlugin.MAX_TEXT_MEMORY
TEXT_READING = 5


def text_chunks(data) -> list[tuple[int, int, bytes, bool]]:
    """(offset, data length, type, whether before the image data) of each text chunk up to IEND,
    as far as the chunks' lengths hold (header.probe refused a PNG of too many small chunks)."""
    found, pos, n, image_data = [], 8, len(data), False
    while pos + 8 <= n:
        length, kind = CHUNK_HEAD.unpack_from(data, pos)
        if kind == b"IEND":
            break
        if kind in TEXT_CHUNKS:
            found.append((pos, length, kind, not image_data))
        image_data = image_data or kind == b"IDAT"
        pos += 12 + length  # length, type, data, CRC
    return found


def acted_on(data, chunks) -> set[int]:
    """The offsets of the chunks of `chunks` Pillow may take an orientation from: each one of a
    keyword of ORIENTATION_KEYWORDS. Each sets what it names in the image's info, the last one
    read staying, but an iTXt Pillow cannot read (compressed by an unknown method, corrupt, not
    UTF-8) sets nothing and leaves an earlier chunk's value: keeping the last one alone lost it."""
    return {pos for pos, length, _, _ in chunks if _ORIENTATION_KEYWORD.match(data, pos + 8, pos + 8 + length)}


def without_text(data):
    """`data` without the text chunks Pillow would not act on (acted_on; and those before the
    image data that fail their CRC check, which it refuses the picture for): `data` itself when
    there are none, else a copy."""
    chunks = text_chunks(data)
    kept = acted_on(data, chunks)
    dropped = [(pos, pos + 12 + length) for pos, length, kind, before_image in chunks
               if pos not in kept and not (before_image and _fails_crc(data, pos, length))]
    if not dropped:
        return data
    data, parts, at = memoryview(data), [], 0  # (slices of it copy nothing)
    for start, end in dropped:
        parts.append(data[at:start])
        at = end
    parts.append(data[at:])
    return b"".join(parts)


def _fails_crc(data, pos: int, length: int) -> bool:
    end = pos + 8 + length
    if end + 4 > len(data):
        return True  # cut short: left to Pillow, as it was
    return zlib.crc32(memoryview(data)[pos + 4:end]) != struct.unpack(">I", bytes(data[end:end + 4]))[0]


def text_bytes(data, chunks, kept: set[int]) -> int:
    """What a decode holds for the text chunks `chunks` (text_chunks) at most: the copy of the
    file without_text makes, the text Pillow keeps of those it is still given (`kept`: acted_on), and
    what reading one holds at its peak, charged for the largest it may read (one before the
    image data may fail its CRC check: not checked here, on the event loop). Uncharged, 60 zTXt
    chunks of 1 MB each in a 63 KB picture kept 60 MB."""
    if not chunks:
        return 0
    costs = {pos: _text_size(length, kind) for pos, length, kind, before_image in chunks
             if pos in kept or before_image}
    largest = max(costs.values(), default=0)
    held = min(sum(costs[pos] for pos in kept), MAX_TEXT_MEMORY + largest)
    return len(data) + held + TEXT_READING * largest


def _text_size(length: int, kind: bytes) -> int:
    """The text a chunk of `length` bytes may hold once read: a tEXt's as it is, a zTXt's
    inflated, an iTXt's either (its compression flag is not read here)."""
    inflated = min(MAX_TEXT_CHUNK, 1032 * length)
    return length if kind == b"tEXt" else inflated if kind == b"zTXt" else max(length, inflated)
