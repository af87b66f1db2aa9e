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


def sampled_jpeg(pixels: np.ndarray, luma: tuple[int, int]) -> bytes:
    """A baseline JFIF JPEG (SOF0) of an RGB uint8 [h, w, 3] picture with Y sampled luma = (H, V)
    and Cb, Cr 1x1 each: (4, 1) is 4:1:1, which Pillow does not write (its `subsampling` takes
    4:4:4, 4:2:2 and 4:2:0). Each 8x8 block keeps only its mean, its DC coefficient (quantised by
    1): a blocky picture. Its own Huffman tables: each DC difference category (0-11) a 4-bit
    code; an AC table of end-of-block alone, a 1-bit code."""
    hf, vf = luma
    h, w = pixels.shape[:2]
    mcu_h, mcu_w = 8 * vf, 8 * hf
    ph, pw = -(-h // mcu_h) * mcu_h, -(-w // mcu_w) * mcu_w  # padded to whole MCUs, its edges repeated
    ycc = np.pad(np.asarray(Image.fromarray(pixels).convert("YCbCr"), np.float64),
                 ((0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    luma_means = ycc[:, :, 0].reshape(ph // 8, 8, pw // 8, 8).mean((1, 3))  # a block each
    chroma_means = ycc[:, :, 1:].reshape(ph // mcu_h, mcu_h, pw // mcu_w, mcu_w, 2).mean((1, 3))  # an MCU each
    bits, previous = [], [0, 0, 0]

    def block(component: int, mean: float) -> None:
        dc = int(round(8 * (mean - 128)))  # a flat block's DC coefficient
        diff, previous[component] = dc - previous[component], dc
        size = abs(diff).bit_length()
        extra = format(diff if diff > 0 else diff + (1 << size) - 1, f"0{size}b") if size else ""
        bits.append(format(size, "04b") + extra + "0")  # then end of block

    for row in range(ph // mcu_h):
        for col in range(pw // mcu_w):
            for v in range(vf):
                for u in range(hf):
                    block(0, luma_means[row * vf + v, col * hf + u])
            block(1, chroma_means[row, col, 0])
            block(2, chroma_means[row, col, 1])
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)  # padded with ones
    coded = int(stream, 2).to_bytes(len(stream) // 8, "big").replace(b"\xff", b"\xff\x00")
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\xff\xdb" + struct.pack(">HB", 67, 0) + bytes([1] * 64)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + bytes([1, hf << 4 | vf, 0, 2, 0x11, 0, 3, 0x11, 0])
    dc_table = b"\xff\xc4" + struct.pack(">HB", 31, 0x00) + bytes([0, 0, 0, 12] + [0] * 12) + bytes(range(12))
    ac_table = b"\xff\xc4" + struct.pack(">HB", 20, 0x10) + bytes([1] + [0] * 15) + b"\x00"
    sos = b"\xff\xda" + struct.pack(">HB", 12, 3) + bytes([1, 0, 2, 0, 3, 0, 0, 63, 0])
    return b"\xff\xd8" + app0 + dqt + sof + dc_table + ac_table + sos + coded + b"\xff\xd9"
