"""Decode one JPEG/PNG and fit it to a plan's H x W on the CPU, with Pillow.

Blocking and GIL-releasing (Pillow decodes and resizes with the interpreter lock released), so
the worker pool runs several at once. Steps: probe the header (format and size limits, before
any pixel is allocated); for a PNG, take out the text chunks Pillow would read for nothing
(png_text.py); for a JPEG, let libjpeg scale by 1/2, 1/4 or 1/8 while decoding when
the target is that much smaller and DRAFT_MARGIN more, unless the plan's filter is nearest
(Image.draft; a grey target takes the luma plane); apply the EXIF orientation; convert to RGB or
grey (alpha is dropped, 16-bit samples keep their high byte); resize per the plan's policy and
filter (nearest takes single pixels; the others are antialiased), from the part of a scaled
picture that is the source's (fit_drafted).
tools/bench_decoders.py measured the alternatives (README).
"""
from __future__ import annotations

import math
import re
import struct
import threading
import warnings

import numpy as np
from PIL import Image, JpegImagePlugin, PngImagePlugin, UnidentifiedImageError

from ..config import ImageSettings
from ..view_file import as_file
from .header import ImageError, ImageInfo, check_size, check_work, probe
from .plan import ImagePlan
from .png_text import without_text

_FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "area": Image.BOX}
_ROTATED = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_FLIPS_X = {2, 3, 6, 7}  # EXIF orientations whose turn brings the stored right or bottom edge to the left
_FLIPS_Y = {3, 4, 7, 8}  # ... to the top
_ORIENTATION = 0x0112
# libjpeg's scaling leaves the resize at least this much to shrink, so that its antialiasing filter
# still smooths: asked for the target's size, a JPEG just over 2^k times the target was decoded
# to about that size and hardly filtered (513 x 513 to 64 x 64: mean 7.6, max 111 levels from a
# full decode; now 3.6, 55). Measured over 32 photo sizes: 0.6 levels closer on average, 1.2x
# the decode time (a full decode: 6x). Pillow's thumbnail() asks twice the size (reducing_gap).
# Re-measured (2026-12-06, README: photos 480-4,097 wide to 8-224): up to 1.2 levels on average
# (bilinear; area 4.7) where the resize shrinks 1.5-2x; 2 here made that 0.8 (3.1) for up to 1.8x
# the decode time at the sizes it scales one step less (1.17x over 10 sizes): kept at 1.5
DRAFT_MARGIN = 1.5
_TURNS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
          5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
          8: Image.Transpose.ROTATE_90}  # what each EXIF orientation asks, as Pillow's exif_transpose


# Pillow warns of what it tolerates in a picture (EXIF tags past the data, a malformed MPO, a
# palette's transparency, a size over its own bomb limit that images.max_pixels allows): notes on
# a client's picture, which decodes or is refused with a 400, not for the server's log. One filter
# for Pillow's own modules (a deprecation Pillow reports is the caller's: not filtered), put in
# the process's list and never taken out: warnings.catch_warnings around each decode swapped the
# whole list in and out from several threads, and two decodes ending out of order left one's
# "ignore everything" in place for every module of the process (catch_warnings is not thread-safe)
_PILLOW_MODULES = r"PIL\."
_filter_lock = threading.Lock()
_pillow_filter: tuple | None = None


def ignore_pillow_notes() -> None:
    """Put the filter for Pillow's warnings in the process's list unless it is there: once, and
    again after whatever replaced the list (warnings.resetwarnings, pytest around each test)."""
    global _pillow_filter
    if _pillow_filter in warnings.filters:
        return
    with _filter_lock:
        if _pillow_filter not in warnings.filters:
            warnings.filterwarnings("ignore", module=_PILLOW_MODULES)
            _pillow_filter = warnings.filters[0]


def fit_box(src_w: int, src_h: int,
            plan: ImagePlan) -> tuple[tuple[int, int], tuple[float, float, float, float] | None]:
    """(resized size, source box) for the plan's policy; letterbox returns the inner size."""
    W, H = plan.width, plan.height
    if plan.resize == "stretch":
        return (W, H), None
    if plan.resize == "center_crop":
        scale = max(W / (src_w * plan.crop_fraction), H / (src_h * plan.crop_fraction))
        # within the picture: with crop_fraction 1.0, H / scale came out a hair past the side for
        # 2-8 % of sizes (107.00000000000001), and Pillow refused the box's negative offset
        bw, bh = min(W / scale, src_w), min(H / scale, src_h)
        left, top = max(0.0, (src_w - bw) / 2), max(0.0, (src_h - bh) / 2)
        return (W, H), (left, top, left + bw, top + bh)
    scale = min(W / src_w, H / src_h)  # letterbox
    return (max(1, round(src_w * scale)), max(1, round(src_h * scale))), None


def _draft_size(src_w: int, src_h: int, plan: ImagePlan) -> tuple[int, int]:
    """The smallest whole-image size the policy needs before its resize."""
    if plan.resize == "center_crop":
        scale = max(plan.width / (src_w * plan.crop_fraction), plan.height / (src_h * plan.crop_fraction))
        return math.ceil(src_w * scale), math.ceil(src_h * scale)
    return fit_box(src_w, src_h, plan)[0]


def jpeg_draft_request(width: int, height: int, orientation: int, plan: ImagePlan) -> tuple[int, int]:
    """The size (unrotated) a JPEG of width x height asks libjpeg for while decoding (Image.draft:
    it then decodes at 1/2, 1/4 or 1/8 of its size when that is still at least this large): what
    the policy needs, DRAFT_MARGIN times; for `nearest`, the full size. Scaled, each pixel is the
    mean of s x s (libjpeg keeps each 8 x 8 block's lowest frequencies), where nearest takes one
    pixel: photos came out 2-8 levels from a full decode on average, up to 16 at some sizes."""
    if plan.interpolation == "nearest":
        return width, height
    rotated = orientation in _ROTATED
    need = _draft_size(height, width, plan) if rotated else _draft_size(width, height, plan)
    need = (math.ceil(need[0] * DRAFT_MARGIN), math.ceil(need[1] * DRAFT_MARGIN))
    return need[::-1] if rotated else need


def draft_scale(width: int, height: int, request: tuple[int, int]) -> int:
    """The 1/scale libjpeg decodes a width x height JPEG at for a draft `request` (Pillow's rule)."""
    fits = min(width // max(1, request[0]), height // max(1, request[1]))
    return next(s for s in (8, 4, 2, 1) if fits >= s or s == 1)


def fit_drafted(source: tuple[int, int], decoded: tuple[int, int], draft_box: tuple[float, ...] | None,
                orientation: int, plan: ImagePlan) -> tuple[tuple[int, int], tuple[float, float, float, float] | None]:
    """fit_box for a picture of `source` size (turned upright) that libjpeg decoded to `decoded`
    (turned too) at 1/s a side: worked out on the source, so that scaling changes only the
    resolution, and put in the decoded pixels. libjpeg rounds the scaled size up, each output pixel
    standing for s x s source ones (105 at 1/8: 14 pixels, 13.125 of picture, the last the edge
    repeated); `draft_box`, what Image.draft returns (Pillow's thumbnail passes it to resize), is
    that picture part, stored way up. Resizing the whole 14 stretched the picture by up to 7 %:
    8 x 8 digits from 105 x 105 JPEGs, 85.6 % right instead of 96.4 %."""
    size, box = fit_box(*source, plan)
    if draft_box is None:
        return size, box
    part_w, part_h = draft_box[2:] if orientation not in _ROTATED else draft_box[3:1:-1]
    # the turn that flips an axis puts the repeated edge at its start (left or top)
    left = decoded[0] - part_w if orientation in _FLIPS_X else 0.0
    top = decoded[1] - part_h if orientation in _FLIPS_Y else 0.0
    x0, y0, x1, y1 = box or (0, 0, *source)
    fx, fy = part_w / source[0], part_h / source[1]
    return size, (left + x0 * fx, top + y0 * fy, left + x1 * fx, top + y1 * fy)


def decode_pixels(data: bytes | memoryview, plan: ImagePlan, max_pixels: int, max_side: int,
                  info: ImageInfo | None = None) -> np.ndarray:
    """uint8 [H, W, C] in the plan's colour order, fitted to its size (letterbox: the picture
    inside, which the plan's to_row pads). Raises ImageError (message safe to show)."""
    info = info or probe(data)
    check_size(info, max_pixels, max_side)
    ignore_pillow_notes()
    mode = "L" if plan.color == "gray" else "RGB"
    try:
        # (a PNG's text chunks, but for those Pillow acts on, taken out: it would inflate each)
        im = Image.open(as_file(without_text(data) if info.format == "PNG" else data), formats=(info.format,))
        if im.size != (info.width, info.height):
            raise ImageError(f"{info.format} header is inconsistent")
        orientation = _orientation(_exif(im, info.format).get(_ORIENTATION, 1))  # (a PNG's eXIf chunk too)
        source = im.size[::-1] if orientation in _ROTATED else im.size
        drafted = None
        if info.format == "JPEG" and not info.lossless:  # (libjpeg refuses to scale a lossless one)
            drafted = im.draft(mode, jpeg_draft_request(im.width, im.height, orientation, plan))
        if orientation != 1:  # (not ImageOps.exif_transpose: it writes the whole EXIF block
            im = im.transpose(_TURNS[orientation])  # back, and a malformed one raised TypeError)
        im = _to_mode(im, mode)
        size, box = fit_drafted(source, im.size, drafted[1] if drafted else None, orientation, plan)
        im = im.resize(size, _FILTERS[plan.interpolation], box=box)
    except ImageError:
        raise
    except Image.DecompressionBombError:  # (CpuDecoder lifts Pillow's limit: it was lowered since)
        raise ImageError(f"{info.format} of {info.width * info.height:,} pixels is over Pillow's own limit (twice "
                         f"PIL.Image.MAX_IMAGE_PIXELS, set below images.max_pixels in this process)") from None
    except UnidentifiedImageError:
        raise ImageError(f"{info.format} could not be decoded ({_why_unopened(data, info.format)})") from None
    except _MALFORMED as e:
        raise ImageError(f"{info.format} could not be decoded ({_inflating(e) or _short(e)})") from None
    pixels = np.asarray(im)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if plan.color == "bgr":
        pixels = pixels[:, :, ::-1]
    return pixels


# what Pillow's parsers raise on malformed data (struct.error & co from truncated fields)
_MALFORMED = (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, KeyError, ZeroDivisionError)


# Pillow's functions that inflate a PNG chunk, up to PngImagePlugin.MAX_TEXT_CHUNK: it says only
# "Decompressed data too large for PngImagePlugin.MAX_TEXT_CHUNK", whatever the chunk
_INFLATED_CHUNKS = {"chunk_iCCP": "its ICC profile (iCCP chunk)", "chunk_zTXt": "a zTXt text chunk",
                    "chunk_iTXt": "an iTXt text chunk"}


def _inflating(e: BaseException) -> str | None:
    """What a PNG chunk Pillow refused to inflate was, said (by the Pillow function that read
    it), else None: an ICC profile past 1 MB was said only to be "decompressed data"."""
    if not (isinstance(e, ValueError) and "MAX_TEXT_CHUNK" in str(e)):
        return None
    tb, chunk = e.__traceback__, None
    while tb is not None:
        chunk = _INFLATED_CHUNKS.get(tb.tb_frame.f_code.co_name, chunk)
        tb = tb.tb_next
    return chunk and (f"{chunk} inflates past {PngImagePlugin.MAX_TEXT_CHUNK:,} bytes, Pillow's "
                      f"PngImagePlugin.MAX_TEXT_CHUNK")


def _exif(im: Image.Image, fmt: str):
    """The picture's EXIF as Pillow reads it, orientation included. A PNG's compressed or
    international text chunk named "exif" or "xmp" holds text where Pillow's reading wants
    bytes, and it raised TypeError: a 500 for a 100-byte picture (found by a helper). A PNG is
    loaded first, outside: Pillow's getexif loads it for an eXIf chunk after the image data, and a
    picture cut short in that data was said to have a malformed EXIF (found by tester t55)."""
    if fmt == "PNG":
        im.load()
    try:
        return im.getexif()
    except (TypeError, *_MALFORMED) as e:
        raise ImageError(f"{fmt} could not be decoded (its EXIF, where its orientation is read, is "
                         f"malformed: {_short(e)})") from None


def _orientation(value) -> int:
    """An EXIF orientation value as Pillow gives it (an int, a rational 6/1, text...) as 1-8,
    matched by equality as exif_transpose matches it: anything else means upright."""
    try:
        return next((turn for turn in _TURNS if turn == value), 1)
    except (TypeError, ValueError):  # a value that cannot be compared with a number
        return 1


def _to_mode(im: Image.Image, mode: str) -> Image.Image:
    if im.mode.startswith("I;16"):  # 16-bit grey: the high byte, without widening (a 6300x6300 PNG
        im = Image.fromarray((np.asarray(im) >> 8).astype(np.uint8))  # took 10 bytes a pixel so)
    elif im.mode == "I":
        im = Image.fromarray((np.asarray(im) >> 8).clip(0, 255).astype(np.uint8))
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA").convert("RGB")  # drop alpha
    return im if im.mode == mode else im.convert(mode)


_PLUGINS = {"JPEG": JpegImagePlugin.JpegImageFile, "PNG": PngImagePlugin.PngImageFile}


def _why_unopened(data, fmt: str) -> str:
    """Pillow's own reason a picture did not open (Image.open says only "cannot identify image
    file": a PNG chunk before the image data failing its CRC check, say), asked of its plugin."""
    try:
        _PLUGINS[fmt](as_file(data)).close()
    except Exception as e:  # (what the plugin raised is the answer, whatever it is)
        return _short(e)
    return "cannot identify image file"


_OBJECT_REPR = re.compile(r"<[^<>]*\bat 0x[0-9a-fA-F]+>")


def _short(e: BaseException) -> str:
    """Pillow's message, short, without the reprs of its objects (Pillow names the stream it was
    given: "cannot identify image file <_io.BytesIO object at 0x...>", an address of ours)."""
    text = " ".join(_OBJECT_REPR.sub("", str(e)).split()) or type(e).__name__
    return text[:120]


def lift_pillow_limit(max_pixels: int) -> None:
    """Let Pillow open what images.max_pixels lets through. Pillow refuses by itself a picture of
    over twice Image.MAX_IMAGE_PIXELS (179 M pixels by default), so a max_pixels above that did
    nothing but make those pictures a 400, "too large to decode". Raised, never lowered: the limit
    is the process's (another server in it, or the program embedding one, may have raised it);
    what a picture's decode holds is still charged to its request first (peak.py)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and 2 * limit < max_pixels:
        Image.MAX_IMAGE_PIXELS = -(-max_pixels // 2)


class CpuDecoder:
    """decode_pixels with the server's limits bound: the decoder the pool calls by default. A
    JPEG's work is bounded first (check_work)."""

    kind = "cpu"

    def __init__(self, max_pixels: int, max_side: int, max_scan_pixels: int = ImageSettings.max_scan_pixels):
        self.max_pixels, self.max_side, self.max_scan_pixels = max_pixels, max_side, max_scan_pixels
        lift_pillow_limit(max_pixels)

    def __call__(self, data: bytes | memoryview, plan: ImagePlan) -> np.ndarray:
        info = probe(data)
        check_size(info, self.max_pixels, self.max_side)
        check_work(info, self.max_scan_pixels)
        return decode_pixels(data, plan, self.max_pixels, self.max_side, info)

    def close(self) -> None:
        pass
