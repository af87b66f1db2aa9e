"""What Pillow holds of a picture's metadata while it decodes it, from the lengths the probe's walk
reads (header.py): charged with the decode (peak.py, header.ImageInfo.metadata_bytes).

Pillow reads whole, in Python, every JPEG marker segment before the first scan and every PNG chunk
but the image data, and keeps some: a JPEG's APPn and COM segments (JpegImageFile.applist), a PNG's
private chunks (PngImageFile.private_chunks), ICC profiles and EXIF. Uncharged, 8 concurrent 32 x 32
pictures carrying 40 MB of such data took 500-700 MB past what their model was charged (found by
tester t88). Pillow has no setting to skip them (its caps are on PNG text and the inflated ICC
profile), and a JPEG's APPn segments are not all idle (APP0 and APP14 say how libjpeg converts its
colours, APP1 its orientation): so they are charged, not taken out. Arithmetic over lengths.
"""
from __future__ import annotations

from PIL import PngImagePlugin

# Copies of a JPEG segment's bytes Pillow holds at once (measured with tracemalloc, Pillow 13):
# each APPn and COM one kept (applist); an APP2 (an ICC profile's part) also sliced and joined
# (16.7 MB of them held 50.2 MB); an EXIF one also joined to the earlier ones (info["exif"] += ...,
# the old and the new held at once) and copied without its header to be read. One segment more
# for what is sliced of one at a time (XMP, MPF, Photoshop resources) and the 64 KB block
# Pillow reads the file in while it decodes; and the Python objects a segment or chunk is kept in
# (a bytes object, a tuple in a list, a dict entry: 150 bytes measured)
APP_COPIES, EXIF_COPIES, SEGMENT_MOST, KEPT_OBJECTS = {0xE2: 3}, 4, 0xFFFF, 256
APP0, APP15, COM = 0xE0, 0xEF, 0xFE
# Reading an EXIF block (Image.getexif: the decode reads its orientation) makes Python objects of
# each entry of its first directory, 12 bytes each, 65,535 at most: 170 bytes an entry measured
# (11.3 MB for a PNG eXIf chunk of 0.79 MB, all entries)
EXIF_ENTRY_BYTES, EXIF_ENTRY, MAX_EXIF_ENTRIES = 200, 12, 0xFFFF
# A PNG chunk Pillow reads whole (ImageFile._safe_read) is held twice while read: in blocks of 64 KB,
# then their join; an iCCP chunk's data besides sliced, and what zlib has not yet inflated of it,
# while its profile inflates to PngImagePlugin.MAX_TEXT_CHUNK at most (deflate inflates 1,032-fold),
# twice while zlib's output grows (a 51 KB chunk inflating past 1 MB held 2.3 MB). The objects the
# blocks are held in add a byte in OBJECTS_SHARE (0.04 % measured).
# Image data is read 64 KB at a time, until the picture is whole: then the rest of its IDAT chunk
# is read at once, and every IDAT chunk after it whole (PngImageFile.load_end): a 32 x 32 picture
# followed by 40 MB in its one IDAT chunk held 40 MB more
READ_COPIES, ICC_READ_COPIES, INFLATING_COPIES, DEFLATE_MOST, OBJECTS_SHARE = 2, 3, 2, 1032, 256


def exif_reading_bytes(size: int) -> int:
    """What reading an EXIF block of `size` bytes holds besides its bytes, at most."""
    return min(size // EXIF_ENTRY, MAX_EXIF_ENTRIES) * EXIF_ENTRY_BYTES


def jpeg_segment_bytes(marker: int, length: int) -> int:
    """What Pillow holds of a segment of `length` bytes before a JPEG's first scan, not of EXIF."""
    if APP0 <= marker <= APP15 or marker == COM:
        return length * APP_COPIES.get(marker, 1) + KEPT_OBJECTS
    return 0  # (DQT, DHT, ... are read and let go, 64 KB at most each)


def jpeg_metadata_bytes(segments: int, exif: int) -> int:
    """What Pillow holds of a JPEG's segments at most: `segments` (jpeg_segment_bytes, summed),
    and its EXIF segments of `exif` bytes in all (their copies and their reading)."""
    if not (segments or exif):
        return 0
    return segments + EXIF_COPIES * exif + exif_reading_bytes(exif) + SEGMENT_MOST


class PngMetadata:
    """The running peak of what Pillow holds of a PNG's chunks read whole, fed each chunk in file
    order but the image data and the text chunks (png_text.py charges those): what it keeps of
    the earlier ones (each private chunk; the last eXIf chunk and ICC profile) and the reading of
    the one at hand."""

    __slots__ = ("peak", "_private", "_exif", "_profile")

    def __init__(self) -> None:
        self.peak = self._private = self._exif = self._profile = 0

    def chunk(self, kind: bytes, length: int) -> None:
        held = self._private + self._exif + self._profile
        if kind == b"iCCP":
            profile = min(DEFLATE_MOST * length, PngImagePlugin.MAX_TEXT_CHUNK)
            self.peak = max(self.peak, held + ICC_READ_COPIES * length + INFLATING_COPIES * profile)
            self._profile = profile
            return
        self.peak = max(self.peak, held + _reading(length))
        if kind[1:2].islower():  # (Pillow's test: the private bit)
            self._private += length + KEPT_OBJECTS
        elif kind == b"eXIf":  # (kept with "Exif\0\0" before it, copied again without it to be read)
            self._exif = 2 * length + exif_reading_bytes(length)

    def image_data(self, first: int, largest_later: int) -> None:
        """The image data's chunks: the length of the first and the largest after it (the picture
        may end in the first: the rest of it is read at once, later ones whole)."""
        held = self._private + self._exif + self._profile
        self.peak = max(self.peak, held + max(first, _reading(largest_later)))


def _reading(length: int) -> int:
    """What Pillow holds while it reads a PNG chunk of `length` bytes whole."""
    return READ_COPIES * length + length // OBJECTS_SHARE
