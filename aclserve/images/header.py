"""What an encoded image says about itself, read from its first bytes without decoding.

Every image is probed before a decoder sees it: its format must be JPEG or PNG and the size its
header announces must be within the limits, so a decompression bomb (a few hundred bytes whose
header announces 60,000 x 60,000 pixels) is refused before anything of that size is allocated.
Pure functions over bytes.
"""
from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from dataclasses import dataclass

from .exif import EXIF_HEADER, exif_orientation
from .jpeg_markers import SOS, markers_after_first_scan
from .jpeg_sampling import samples_per_pixel, subsampling
from .metadata_cost import PngMetadata, jpeg_metadata_bytes, jpeg_segment_bytes
from .png_text import CHUNK_HEAD, MAX_ORIENTATION_TEXTS, ORIENTATION_KEYWORDS, TEXT_CHUNKS, acted_on, text_bytes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOI = b"\xff\xd8"
# how base64 text of a JPEG (FF D8 FF) or a PNG file begins, and a data URL
BASE64_STARTS = (b"/9j/", b"iVBORw0K", b"data:image/")
# Start-of-frame markers carry the size: SOF0-3, 5-7, 9-11, 13-15 (not DHT C4, JPG C8, DAC CC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_SOF0, _APP0, _APP1, _APP14 = 0xC0, 0xE0, 0xE1, 0xEE
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
_LOSSLESS, _LOSSLESS_ARITHMETIC = 0xC3, 0xCB  # libjpeg-turbo 3 decodes the first (at full size only)
_HIERARCHICAL = {0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF}  # differential frames: libjpeg decodes none
_XMP = b"http://ns.adobe.com/xap/1.0/\0"  # ... and one of XMP data
# Pillow takes an orientation from XMP when EXIF has none (Image.getexif), and so turns the picture
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(?:="|>)([0-9])')
_PNG_ALPHA_TYPES = {3, 4, 6}  # palette (its transparency is a tRNS chunk further on), grey + alpha, RGBA
_NO_LENGTH = {0x01, 0xD8} | set(range(0xD0, 0xD8))  # TEM, SOI, RST0-7
# Marker segments a JPEG may have before its first scan, and after it (real ones have a few
# dozen at most: APPn, DQT, DHT, COM), and small chunks a PNG may have: 2-byte JPEG segments
# packed into a body cost the probe about 1 s per 8 MB, and server/images.py probes every picture
# on the event loop to charge its decode
MAX_SEGMENTS = 1024
# Scans a JPEG coded in several (progressive) may have: libjpeg's progressive script writes 10,
# optimisers a few more; each is a pass over the coefficients of the whole picture, so a few KB
# of repeated scans held a decode thread for seconds (4000 x 4000, 1,000 scans: 11 s)
MAX_SCANS = 64
# EXIF segments a JPEG may have (real ones have one): Pillow joins each to the ones before it, a
# copy of them all each time, so 1,000 of 64 KB held a decode thread 29 s and 262 MB
MAX_EXIF_SEGMENTS = 16
SMALL_CHUNK = 4096  # a PNG chunk under this many bytes counts toward MAX_SEGMENTS (the walk is per chunk)
# ... an image data (IDAT) one toward MAX_SEGMENTS and one per this many bytes of the file: a
# streaming encoder writes one per row (1,201 for a 1000 x 1200 photo of 2.4 MB), while the walk,
# on the event loop, stays within one chunk per 256 bytes read (50 ms for 64 MB of them)
SMALL_IDAT_SPACING = 256
_NOT_FILL = re.compile(rb"[^\xff]")
_OTHER_FORMATS = ((b"GIF8", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
                  (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000"))
# ISO-BMFF files (a first box `ftyp`) by the brands it lists: a phone's HEIC photo, an AVIF
_BMFF_BRANDS = (({b"avif", b"avis"}, "AVIF"),
                ({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}, "HEIF (HEIC)"))


class ImageError(ValueError):
    """The bytes are not an acceptable image; the message is safe to show a client."""


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "JPEG" | "PNG"
    width: int
    height: int
    baseline: bool = False  # JPEG: a baseline frame (SOF0), the only kind a chip's JPEG decoder takes
    orientation: int = 1  # JPEG: the EXIF Orientation tag before the frame (1: none, 2-8: flips, turns)
    ycc: bool = True  # JPEG: coded as YCbCr or grey (a chip's JPEG decoder takes no other: RGB, CMYK)
    progressive: bool = False  # JPEG: a progressive frame (libjpeg keeps every DCT coefficient while decoding)
    samples_per_pixel: float = 3.0  # JPEG: the components' samples over a full-size pixel (4:2:0 YCbCr 1.5)
    subsampling: str = "4:2:0"  # JPEG: its components' sampling (jpeg_sampling.py), "4:4:4", ..., "4:0:0" (grey)
    buffered: bool = False  # JPEG: libjpeg keeps every DCT coefficient while decoding (progressive, or
    # a first scan of fewer components than the frame: a sequential JPEG in several scans)
    alpha: bool = False  # PNG: palette or alpha colour type (decoded through RGBA)
    text_bytes: int = 0  # PNG: what its text chunks cost its decode at the peak, at most (png_text.py)
    lossless: bool = False  # JPEG: a lossless frame (SOF3), which libjpeg cannot scale while decoding
    may_turn: bool = False  # the decode may turn or flip it, copying it whole: a JPEG of an orientation but
    # 1; a PNG whose eXIf chunk says one (or is over 64 KB), or with a text chunk Pillow may read one from
    metadata_bytes: int = 0  # what Pillow holds of the segments or chunks it reads whole (metadata_cost.py)
    scans: int = 1  # JPEG: the scans libjpeg reads (counted where it keeps every coefficient: _check_scans)


def probe(data: bytes | memoryview) -> ImageInfo:
    """Format and announced size. Raises ImageError for anything but a readable JPEG/PNG header."""
    kind = _jpeg_or_png(data)
    if kind == "PNG":
        return _png(data)
    if kind == "JPEG":
        return _jpeg(data)
    if not len(data):
        raise ImageError("empty image")
    other = other_format(data)
    if other is not None:
        raise ImageError(f"{other} images are not accepted (send JPEG or PNG)")
    # tritonclient sends BYTES in binary form by default: a base64 string goes as its text
    if bytes(data[:12]).startswith(BASE64_STARTS):
        raise ImageError("base64 text of an image, not its file's bytes (a JSON element is the file in base64 "
                         "once; an element in binary form or over gRPC is the file itself)")
    raise ImageError("not a JPEG or PNG image")


def image_format(data: bytes | memoryview) -> str | None:
    """The picture format `data` begins with, by its signature: JPEG, PNG or other_format's."""
    return _jpeg_or_png(data) or other_format(data)


def picture_file(data: bytes | memoryview) -> str | None:
    """PNG or JPEG when `data` is such a file by what a tensor's bytes do not hold by chance:
    PNG's 8-byte signature, or JPEG's FF D8 FF followed by a header probe() reads (its segments up
    to the first scan): those 3 bytes alone are a UINT8 pixel of 255, 216, 255. Else None."""
    kind = _jpeg_or_png(data)
    if kind == "JPEG":
        if bytes(data[2:3]) != b"\xff":
            return None
        try:
            probe(data)
        except ImageError:
            return None
    return kind


def _jpeg_or_png(data: bytes | memoryview) -> str | None:
    """PNG or JPEG when `data` begins with that format's signature (PNG's 8 bytes, JPEG's SOI), else None."""
    head = bytes(data[:8])
    if head == PNG_SIGNATURE:
        return "PNG"
    return "JPEG" if head[:2] == JPEG_SOI else None


def other_format(data: bytes | memoryview) -> str | None:
    """The name of a picture format other than JPEG and PNG that `data` begins with (GIF, BMP,
    TIFF, JPEG 2000, WebP, HEIF, AVIF), else None."""
    head = bytes(data[:8])
    for magic, name in _OTHER_FORMATS:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and bytes(data[8:12]) == b"WEBP":
        return "WebP"
    if head[4:8] == b"ftyp":
        brands = _bmff_brands(data)
        for names, name in _BMFF_BRANDS:
            if brands & names:
                return name
    return None


def _bmff_brands(data) -> set[bytes]:
    """The major and compatible brands of an ISO-BMFF `ftyp` box (its size, b"ftyp", the major
    brand, a version, then the compatible brands), read within its first 64 bytes."""
    (size,) = struct.unpack(">I", bytes(data[:4]))
    box = bytes(data[8:min(size, 64)])
    return {box[:4]} | {box[k:k + 4] for k in range(8, len(box) - 3, 4)}


def check_size(info: ImageInfo, max_pixels: int, max_side: int) -> None:
    if info.width == 0 or info.height == 0:
        raise ImageError(f"{info.format} header announces an empty {info.width}x{info.height} image")
    if info.width > max_side or info.height > max_side or info.width * info.height > max_pixels:
        raise ImageError(f"{info.format} header announces {info.width}x{info.height} pixels; the limit is "
                         f"{max_pixels:,} pixels and {max_side} a side (images.max_pixels, images.max_side)")


def check_work(info: ImageInfo, max_scan_pixels: int) -> None:
    """Refuse a JPEG whose pixels x scans pass `max_scan_pixels` (images.max_scan_pixels): libjpeg
    passes over the coefficients of the whole picture once per scan, however few bytes a scan
    holds, and a 239 KB grey 16384 x 2441 JPEG of 64 refinement scans held a decode thread 2-4 s
    (tester t88). Measured (2026-12-07, CPU time of one decode, Pillow 13 and libjpeg-turbo on
    the shared test machine): such repeated refinement scans cost 0.62-0.71 ns a pixel and scan
    (4000 x 3000 to 16384 x 2441, grey or RGB), progressive photos 0.04-0.07 (10 scans)."""
    if info.format == "JPEG" and info.width * info.height * info.scans > max_scan_pixels:
        raise ImageError(f"JPEG of {info.width}x{info.height} pixels in {info.scans} scan{'s' * (info.scans > 1)} is "
                         f"{info.width * info.height * info.scans:,} pixels x scans to decode; the limit is "
                         f"{max_scan_pixels:,} (images.max_scan_pixels: each scan is a pass over the whole "
                         f"picture; a progressive JPEG has about 10)")


def _png(data) -> ImageInfo:
    # signature, then the IHDR chunk: length (13), b"IHDR", width, height (big-endian), 5 bytes
    # more, its CRC (Pillow checks it, and said only "cannot identify image file")
    if len(data) < 33:
        raise ImageError("PNG is truncated (it ends in its IHDR header)")
    if bytes(data[12:16]) != b"IHDR":
        raise ImageError("PNG is corrupt (it does not begin with an IHDR header)")
    if zlib.crc32(data[12:29]) != struct.unpack(">I", bytes(data[29:33]))[0]:
        raise ImageError("PNG is corrupt (its IHDR header fails its CRC check)")
    width, height = struct.unpack(">II", bytes(data[16:24]))
    color_type = data[25] if len(data) > 25 else 0
    text_bytes, may_turn, metadata_bytes = _png_chunks(data)
    return ImageInfo("PNG", width, height, alpha=color_type in _PNG_ALPHA_TYPES, text_bytes=text_bytes,
                     may_turn=may_turn, metadata_bytes=metadata_bytes)


def _png_chunks(data) -> tuple[int, bool, int]:
    """Refuse a PNG of more than MAX_SEGMENTS chunks under SMALL_CHUNK bytes besides its image
    data, wherever they are (real ones have a few: PLTE, tRNS, gAMA, pHYs, some text), or of more
    IDAT chunks under SMALL_CHUNK bytes than MAX_SEGMENTS and one per SMALL_IDAT_SPACING bytes of
    the file (image data comes in chunks of 8 or 64 KB, or one a row from a streaming encoder):
    Pillow reads each chunk in Python, holding a decode thread about 1 s for 500,000 empty text
    chunks (6 MB), 0.3 s for as many IDAT ones, before the image data, in it or after it; so does
    this walk, on the event loop. A PNG whose bytes end (or whose lengths run past them) before
    its first IDAT chunk is refused (Pillow said only "cannot identify image file"); one cut in
    its image data is left to the decode. So is refused one of more text chunks Pillow may read
    an orientation from than png_text.MAX_ORIENTATION_TEXTS (the decode gives it them all, each
    inflating to 1 MB at most). The walk ends at IEND: Pillow reads nothing after it (20,000 zero
    bytes appended were refused as small chunks; found by tester t88). Returns what its text
    chunks cost the decode at its peak (png_text.text_bytes), whether Pillow may turn it
    (ImageInfo.may_turn), and what it holds of the other chunks it reads whole (metadata_cost.py)."""
    n, pos, small, small_idat, texts, turned, exif_seen = len(data), 8, 0, 0, [], False, False
    kind, image_data, idat_limit, metadata = b"", False, MAX_SEGMENTS + n // SMALL_IDAT_SPACING, PngMetadata()
    first_idat = later_idat = 0  # (what of the image data Pillow may read whole: metadata_cost.py)
    while pos + 8 <= n:
        length, kind = CHUNK_HEAD.unpack_from(data, pos)  # (3x quicker than slicing: 0.2 us a chunk)
        if kind == b"IDAT":
            if length < SMALL_CHUNK:
                small_idat += 1
                if small_idat > idat_limit:
                    raise ImageError(f"PNG has more than {idat_limit:,} image data (IDAT) chunks of under "
                                     f"{SMALL_CHUNK} bytes ({MAX_SEGMENTS:,} and one per {SMALL_IDAT_SPACING} "
                                     f"bytes of the file)")
            elif image_data and length > later_idat:
                later_idat = length
            if not image_data:
                image_data, first_idat = True, length
            pos += 12 + length
            continue
        if kind == b"IEND":
            break
        if length < SMALL_CHUNK:
            small += 1
            if small > MAX_SEGMENTS:
                raise ImageError(f"PNG has more than {MAX_SEGMENTS} chunks of under {SMALL_CHUNK} bytes besides "
                                 f"its image data")
        if kind in TEXT_CHUNKS:
            texts.append((pos, length, kind, not image_data))
        else:
            if kind == b"eXIf":  # read as a JPEG's EXIF segment: one, small (the walk is on the loop)
                # (a later one errs turned, uncopied: copying 1,000 of 64 KB each took 11 ms more)
                turned = (exif_seen or length > 0xFFFF
                          or exif_orientation(EXIF_HEADER + bytes(data[pos + 8:pos + 8 + length])) != 1)
                exif_seen = True
            metadata.chunk(kind, min(length, n - pos - 8))
        pos += 12 + length  # length, type, data, CRC
    if not image_data:
        raise ImageError("PNG has no image data (IDAT chunk)" if kind == b"IEND" else
                         "PNG is truncated (or corrupt) before its image data")
    kept = acted_on(data, texts)  # (once: a pass matches every text chunk's keyword)
    if len(kept) > MAX_ORIENTATION_TEXTS:
        names = ", ".join(sorted(word.decode() for word in ORIENTATION_KEYWORDS))
        raise ImageError(f"PNG has more than {MAX_ORIENTATION_TEXTS} text chunks of a keyword an orientation "
                         f"is read from ({names})")
    metadata.image_data(min(first_idat, n), min(later_idat, n))
    return text_bytes(data, texts, kept), turned or bool(kept), metadata.peak


def _jpeg(data) -> ImageInfo:
    n, pos, orientation, xmp_orientation = len(data), 2, 1, 1
    exif_segments = 0  # only the first one's orientation counts (as in Pillow, which decodes it)
    metadata = exif_bytes = 0  # what Pillow holds of the segments (metadata_cost.py); their EXIF, joined
    jfif, adobe_transform = False, None  # what says how three components are coded
    frame = None  # the ImageInfo of the frame header, read on to the first scan's header

    def oriented(frame: ImageInfo) -> ImageInfo:
        """The frame turned as the segments read so far say (Pillow reads them up to the scan:
        EXIF or XMP may follow the frame header); XMP's only when EXIF says nothing else (when
        EXIF says 1, Pillow keeps it upright and this errs towards turned, which sends it to
        the CPU decoder, not DVPP's)."""
        turn = orientation if orientation != 1 else xmp_orientation
        return dataclasses.replace(frame, orientation=turn, may_turn=turn != 1,
                                   metadata_bytes=jpeg_metadata_bytes(metadata, exif_bytes))
    for _ in range(MAX_SEGMENTS):
        if pos >= n:
            break
        if data[pos] != 0xFF:
            raise ImageError(f"JPEG is corrupt (no marker at byte {pos})")
        fill_end = _NOT_FILL.search(data, pos)  # fill bytes, skipped in C: a body of them took 0.3 s per 8 MB
        if fill_end is None:
            break
        pos = fill_end.start()
        marker = data[pos]
        pos += 1
        if marker in _NO_LENGTH:
            continue
        if pos + 2 > n:
            break
        (length,) = struct.unpack(">H", bytes(data[pos:pos + 2]))
        if length < 2:
            raise ImageError("JPEG is corrupt (bad segment length)")
        if marker == _APP1 and bytes(data[pos + 2:pos + 8]) == EXIF_HEADER:
            exif_segments, exif_bytes = exif_segments + 1, exif_bytes + min(length, n - pos)
            if exif_segments > MAX_EXIF_SEGMENTS:
                raise ImageError(f"JPEG has more than {MAX_EXIF_SEGMENTS} EXIF segments (Pillow joins each to "
                                 f"those before it)")
            if exif_segments == 1:  # (each one read would walk its entries: 1,000 took the event loop 1 s)
                orientation = exif_orientation(bytes(data[pos + 2:pos + length]))
        else:
            metadata += jpeg_segment_bytes(marker, min(length, n - pos))
        if marker == _APP1 and bytes(data[pos + 2:pos + 2 + len(_XMP)]) == _XMP:
            found = _XMP_ORIENTATION.search(data, pos + 2 + len(_XMP), pos + length)  # (the last one counts)
            xmp_orientation = int(found[1]) if found and 2 <= int(found[1]) <= 8 else 1
        elif marker == _APP0 and bytes(data[pos + 2:pos + 7]) == b"JFIF\0":
            jfif = True
        elif marker == _APP14 and length >= 14 and bytes(data[pos + 2:pos + 7]) == b"Adobe" and pos + 14 <= n:
            adobe_transform = data[pos + 13]
        if marker in _SOF:
            if pos + 8 > n:
                break
            _check_frame_kind(marker, data[pos + 2])
            height, width = struct.unpack(">HH", bytes(data[pos + 3:pos + 7]))
            specs = bytes(data[pos + 8:pos + 8 + 3 * data[pos + 7]])  # (id, sampling HV, table) each
            progressive, components = marker in _PROGRESSIVE, data[pos + 7]
            frame = ImageInfo("JPEG", width, height, marker == _SOF0, 1,
                              _coded_ycc(specs[::3], jfif, adobe_transform), progressive,
                              samples_per_pixel(specs[1::3]), subsampling(specs[1::3]), buffered=progressive,
                              lossless=marker == _LOSSLESS)
        if marker == 0xDA:
            if frame is None:
                raise ImageError("JPEG is corrupt (image data before the frame header)")
            if pos + length >= n:  # (Pillow said "cannot identify image file" for a scan header cut short)
                raise ImageError("JPEG is truncated before its image data")
            # libjpeg keeps the whole image's coefficients when the first scan does not hold every
            # component, progressive or not (jdinput.c: has_multiple_scans)
            if pos + 2 < n and data[pos + 2] < components:
                frame = dataclasses.replace(frame, buffered=True)
            if frame.buffered:
                frame = dataclasses.replace(frame, scans=_check_scans(data, pos))
            return oriented(frame)
        pos += length
    else:  # (past the frame too: Pillow reads each up to the scan, 8 MB of empty comments in 2.2 s, and keeps them)
        raise ImageError(f"JPEG has more than {MAX_SEGMENTS} segments before its "
                         f"{'frame header' if frame is None else 'first scan'}")
    # the bytes ended (or a segment's length ran past them) before the first scan
    raise ImageError(f"JPEG is truncated before its {'frame header' if frame is None else 'image data'}")


def _check_frame_kind(marker: int, precision: int) -> None:
    """Refuse a frame Pillow and libjpeg do not decode, in words (they said "cannot identify
    image file" or "broken data stream"): Pillow takes 8-bit samples only, libjpeg no
    hierarchical frame and no lossless one coded arithmetically."""
    if marker in _HIERARCHICAL:
        raise ImageError(f"hierarchical JPEG (SOF{marker & 15}) is not supported (send a baseline, progressive "
                         f"or lossless one)")
    if precision != 8:
        raise ImageError(f"{precision}-bit JPEG is not supported (8-bit samples only)")
    if marker == _LOSSLESS_ARITHMETIC:
        raise ImageError("arithmetic-coded lossless JPEG (SOF11) is not supported (lossless with Huffman "
                         "coding, SOF3, is)")


def _check_scans(data, pos: int) -> int:
    """The scans of a JPEG (its first one's header at `pos`), counted as libjpeg reads them up to
    the end of the picture (jpeg_markers.py); refused past MAX_SCANS, or past MAX_SEGMENTS
    segments after its first scan (the walk is on the event loop)."""
    scans = 1
    for segments, marker in enumerate(markers_after_first_scan(data, pos), start=1):
        if segments > MAX_SEGMENTS:
            raise ImageError(f"JPEG has more than {MAX_SEGMENTS} segments after its first scan")
        if marker == SOS:
            scans += 1
            if scans > MAX_SCANS:
                raise ImageError(f"JPEG has more than {MAX_SCANS} scans (a progressive JPEG has about 10; "
                                 f"each one is a pass over the whole picture)")
    return scans


def _coded_ycc(ids: bytes, jfif: bool, adobe_transform: int | None) -> bool:
    """Whether a JPEG's components are YCbCr or grey, as libjpeg decides it: one component is
    grey; three are YCbCr under a JFIF marker, RGB under an Adobe marker with transform 0, else
    RGB only when named R, G, B; four are CMYK or YCCK."""
    if len(ids) == 1:
        return True
    if len(ids) != 3:
        return False
    if jfif:
        return True
    if adobe_transform is not None:
        return adobe_transform != 0
    return ids != b"RGB"
