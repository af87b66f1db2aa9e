"""Encoded test images made on the spot (Pillow), including hostile ones."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def encode(pixels: np.ndarray, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **kw)
    return buf.getvalue()


def gradient(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """A smooth picture with some texture (JPEG-friendly), uint8 [h, w, c] (or [h, w])."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(seed)
    planes = [(xx / w * 200 + 20 * np.sin(yy / 7 + c)) + rng.normal(0, 3, (h, w)) for c in range(channels)]
    out = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return out[:, :, 0] if channels == 1 else out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A valid-looking RGB PNG of a few hundred bytes whose header announces width x height."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + 3 * min(width, 64)) * 4, 9)  # a few rows; the rest "to come"
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")


def jpeg_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A JPEG start whose frame header (SOF0) announces width x height."""
    real = encode(gradient(16, 16), "JPEG")
    sof = real.index(b"\xff\xc0")
    return real[:sof + 5] + struct.pack(">HH", height, width) + real[sof + 9:]
