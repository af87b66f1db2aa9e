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


def white_bilevel_png(width: int, height: int) -> bytes:
    """A whole 1-bit white PNG of width x height: a picture of many pixels in few bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = zlib.compress((b"\x00" + b"\xff" * -(-width // 8)) * height, 1)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")


def jpeg_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A JPEG start whose frame header (SOF0) announces width x height."""
    real = encode(gradient(16, 16), "JPEG")
    sof = real.index(b"\xff\xc0")
    return real[:sof + 5] + struct.pack(">HH", height, width) + real[sof + 9:]


def lossless_jpeg(grey: np.ndarray) -> bytes:
    """A lossless JPEG (SOF3, 8-bit, one component, predictor 1: the sample to the left) of a
    uint8 [h, w] picture, Huffman-coded with one table giving each difference category (0-8) a
    4-bit code: Pillow writes none."""
    h, w = grey.shape
    rows = grey.astype(np.int32)
    predicted = np.empty_like(rows)
    predicted[:, 1:] = rows[:, :-1]  # left; the first column takes the sample above, the first sample 128
    predicted[1:, 0], predicted[0, 0] = rows[:-1, 0], 128
    bits = []
    for diff in (rows - predicted).ravel().tolist():
        size = abs(diff).bit_length()
        bits.append(format(size, "04b") + (format(diff if diff > 0 else diff + (1 << size) - 1, f"0{size}b")
                                           if size else ""))
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)  # padded with ones
    coded = int(stream, 2).to_bytes(len(stream) // 8, "big").replace(b"\xff", b"\xff\x00")
    sof = b"\xff\xc3" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    dht = b"\xff\xc4" + struct.pack(">HB", 28, 0) + bytes([0, 0, 0, 9] + [0] * 12) + bytes(range(9))
    sos = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00" + bytes([1, 0, 0])  # predictor 1, Se 0, Ah/Al 0
    return b"\xff\xd8" + sof + dht + sos + coded + b"\xff\xd9"
