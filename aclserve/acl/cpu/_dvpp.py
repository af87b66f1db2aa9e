"""The pixel work of the CPU runtime's DVPP (media.py): what JPEGD and VPC compute, on numpy.

JPEGD: a JPEG's frame header read as the chip reads it (size, components, coding, colour,
sampling), and the image decoded by Pillow (libjpeg) to YCbCr, its chroma averaged 2x2 down to
4:2:0, as NV12 (a grey JPEG gets U and V of 128, as JPEGD pads a 4:0:0 one). VPC: NV12 resized
plane by plane with Pillow's bilinear filter. The chip's own filters (its chroma siting, its
scaler's taps) are not documented: outputs agree with the chip's in size, layout and strides,
and in pixels only within what a bilinear resize and 2x2 chroma averaging differ from them.

Frames are read and written in place in DVPP memory (process memory here) through their
addresses and the descriptor's strides.
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ...view_file import as_file

_SOF_BASELINE, _SOF_EXTENDED = 0xC0, 0xC1  # Huffman-coded, sequential: what JPEGD decodes
_APP0, _APP14 = 0xE0, 0xEE  # JFIF's segment, Adobe's (which says how the components are coded)
# JPEGD's source formats (acldvppJpegFormat: 444, 422, 420, 400, 440, 411) by the component's
# sampling factors (H << 4 | V), Y then Cb and Cr; JPEGD decodes all but 4:1:1 (CANN's JPEGD
# constraints: "444/422/420/400/440"), and no other factors
_JPEG_FORMATS = {(0x11, 0x11, 0x11): "4:4:4", (0x21, 0x11, 0x11): "4:2:2", (0x22, 0x11, 0x11): "4:2:0",
                 (0x12, 0x11, 0x11): "4:4:0", (0x41, 0x11, 0x11): "4:1:1"}
_JPEGD_FORMATS = ("4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:0:0")
_SOF_OTHER = {0xC2: "progressive", 0xC3: "lossless", 0xC5: "differential", 0xC6: "differential progressive",
              0xC7: "differential lossless", 0xC9: "arithmetic-coded", 0xCA: "arithmetic-coded progressive",
              0xCB: "arithmetic-coded lossless", 0xCD: "arithmetic-coded differential",
              0xCE: "arithmetic-coded differential", 0xCF: "arithmetic-coded differential"}


class Refused(Exception):
    """What JPEGD or VPC does not do (the task fails)."""


@dataclass(frozen=True)
class JpegFrame:
    width: int
    height: int
    components: int
    coding: str  # "baseline" or one of _SOF_OTHER's values
    colour: str = "YCbCr"  # how the components are coded: "grey", "YCbCr", "RGB", "CMYK", "YCCK", ...
    sampling: str = "4:2:0"  # its source format (_JPEG_FORMATS, "4:0:0" for one component) or factors


def _colour(ids: bytes, jfif: bool, adobe_transform: int | None) -> str:
    """How a decoder reads the frame's components (libjpeg's rule, jdapimin.c): one is grey;
    three YCbCr under a JFIF marker, RGB under an Adobe one of transform 0, else RGB only when
    named R, G, B; four CMYK, or YCCK under an Adobe transform 2."""
    if len(ids) == 1:
        return "grey"
    if len(ids) == 4:
        return "YCCK" if adobe_transform == 2 else "CMYK"
    if len(ids) != 3:
        return f"{len(ids)} components"
    if not jfif and (adobe_transform == 0 or (adobe_transform is None and ids == b"RGB")):
        return "RGB"
    return "YCbCr"


def _sampling(factors: bytes) -> str:
    """The frame's source format by its components' sampling factors, or the factors ("HxV, ...")."""
    if len(factors) == 1:
        return "4:0:0"  # (a lone component's factors do not matter)
    return _JPEG_FORMATS.get(tuple(factors)) or ", ".join(f"{f >> 4}x{f & 15}" for f in factors)


def refusal(frame: JpegFrame) -> str | None:
    """Why JPEGD does not decode `frame` (CANN's ACL_ERROR_UNSUPPORTED_JPEG: Huffman-coded
    sequential JPEGs of YUV colour, sampled 4:4:4, 4:2:2, 4:2:0, 4:0:0 or 4:4:0, only), or None
    when it does."""
    if frame.coding != "baseline":
        return f"JPEGD decodes Huffman-coded sequential JPEGs only, not {frame.coding} ones"
    if frame.colour not in ("grey", "YCbCr"):
        return f"JPEGD decodes YUV JPEGs only (YCbCr or grey), not {frame.colour} ones"
    if frame.sampling not in _JPEGD_FORMATS:
        return (f"JPEGD decodes JPEGs sampled {', '.join(_JPEGD_FORMATS)} only, not one sampled "
                f"{frame.sampling}")
    return None


def read_frame(data: bytes | memoryview) -> JpegFrame:
    """The JPEG's frame header (SOFn), its colour read from the segments before it. Raises
    Refused when `data` is no JPEG or has no frame."""
    if data[:2] != b"\xff\xd8":
        raise Refused("not a JPEG (no SOI marker)")
    i, jfif, adobe_transform = 2, False, None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise Refused(f"not a JPEG (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker == _APP0 and data[i + 4:i + 9] == b"JFIF\0":
            jfif = True
        elif marker == _APP14 and data[i + 4:i + 9] == b"Adobe" and length >= 12 and i + 15 < len(data):
            adobe_transform = data[i + 15]  # (after "Adobe", its version and two flag words)
        if marker in (_SOF_BASELINE, _SOF_EXTENDED) or marker in _SOF_OTHER:
            if i + 10 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            coding = "baseline" if marker in (_SOF_BASELINE, _SOF_EXTENDED) else _SOF_OTHER[marker]
            specs = data[i + 10:i + 10 + 3 * data[i + 9]]  # (id, sampling, table) a component
            return JpegFrame(width, height, data[i + 9], coding, _colour(specs[::3], jfif, adobe_transform),
                             _sampling(specs[1::3]))
        if marker == 0xDA:
            break
        i += 2 + length
    raise Refused("not a JPEG (no frame header before the scan)")


def decode_nv12(data: bytes | memoryview, frame: JpegFrame) -> tuple[np.ndarray, np.ndarray]:
    """(Y [h, w], UV [h/2, w/2, 2]) of the JPEG (`frame`: its read_frame), its sides rounded
    down to even (JPEGD rounds an odd side down for YUV420SP). Raises Refused for what JPEGD
    does not decode."""
    why = refusal(frame)
    if why:
        raise Refused(why)
    try:
        with Image.open(as_file(data)) as im:
            im.draft("YCbCr" if frame.components == 3 else "L", im.size)  # no colour conversion
            im.load()
            if im.mode not in ("YCbCr", "L"):  # Pillow reads another colour than the header says: not YUV
                raise Refused(f"JPEGD decodes YUV JPEGs only, this one is coded as {im.mode}")
            pixels = np.asarray(im)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise Refused(f"JPEGD cannot decode it: {e}") from None
    h, w = pixels.shape[0] // 2 * 2, pixels.shape[1] // 2 * 2
    if frame.components == 1:
        return pixels[:h, :w].copy(), np.full((h // 2, w // 2, 2), 128, np.uint8)
    pixels = pixels[:h, :w]
    chroma = pixels[:, :, 1:].astype(np.uint16).reshape(h // 2, 2, w // 2, 2, 2).sum((1, 3))
    return pixels[:, :, 0].copy(), ((chroma + 2) // 4).astype(np.uint8)


def resize_nv12(y: np.ndarray, uv: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """NV12 planes resized to width x height (both even), bilinear, plane by plane."""
    def plane(a: np.ndarray, w: int, h: int) -> np.ndarray:
        return np.asarray(Image.fromarray(a).resize((w, h), Image.BILINEAR))
    out_uv = np.stack([plane(np.ascontiguousarray(uv[:, :, k]), width // 2, height // 2) for k in (0, 1)], -1)
    return plane(y, width, height), out_uv


def _view(ptr: int, size: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_ubyte * size).from_address(ptr), np.uint8)


def bytes_at(ptr: int, size: int) -> memoryview:
    """The `size` bytes at `ptr`, in place (a memoryview of them: no copy)."""
    return memoryview(_view(ptr, size))


def nv12_bytes(stride_w: int, stride_h: int) -> int:
    return stride_w * stride_h * 3 // 2


def read_nv12(ptr: int, width: int, height: int, stride_w: int, stride_h: int) -> tuple[np.ndarray, np.ndarray]:
    """The width x height NV12 picture at `ptr`, laid out at the strides (copies)."""
    mem = _view(ptr, nv12_bytes(stride_w, stride_h))
    y = mem[:stride_w * stride_h].reshape(stride_h, stride_w)[:height, :width].copy()
    uv = mem[stride_w * stride_h:].reshape(stride_h // 2, stride_w // 2, 2)[:height // 2, :width // 2].copy()
    return y, uv


def write_nv12(ptr: int, stride_w: int, stride_h: int, y: np.ndarray, uv: np.ndarray) -> None:
    """Write the planes at `ptr` at the strides; the padding is left as it was."""
    mem = _view(ptr, nv12_bytes(stride_w, stride_h))
    h, w = y.shape
    mem[:stride_w * stride_h].reshape(stride_h, stride_w)[:h, :w] = y
    mem[stride_w * stride_h:].reshape(stride_h // 2, stride_w // 2, 2)[:h // 2, :w // 2] = uv
