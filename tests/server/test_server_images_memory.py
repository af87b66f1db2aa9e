"""What decoding a request's pictures holds, charged to its request memory before the decode,
through a real server of the test's own serving the shipped image-input digits example: a small
file announcing a huge picture, a picture's metadata (an ICC profile), photos libjpeg decodes
scaled down; the charge given back once the decodes end."""
from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import struct

import aiohttp
import numpy as np

from tests import REPO
from tests.images.images_data import encode
from tests.serving import ServerThread, request, server_config

from .image_requests import DIGITS, b64, digit_png, infer


def _digits_image_repository(folder) -> None:
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt"):
        shutil.copy(os.path.join(REPO, "models", name), folder / name)


def test_what_decoding_pictures_holds_is_charged_to_the_request_memory(tmp_path):
    """A small PNG may announce a huge picture (under max_pixels): what its decode holds at its
    peak (8 bytes a pixel for a grey PNG, images/peak.py) is charged before it is decoded, so a
    request alone over max_request_bytes is a 413 naming it, and the decodes of many could not
    take the server's memory past max_inflight_bytes unseen (they took 1 GB); the charge is
    given back once the decodes end."""
    _digits_image_repository(tmp_path)
    config = server_config(tmp_path, images={"workers": 2}, max_request_bytes=64 << 20)
    big = b64(encode(np.zeros((3000, 3000), np.uint8)))  # 9 M pixels in a few KB: 72 MB to decode
    small = b64(digit_png(DIGITS["x"][3], 16))
    with ServerThread(config) as srv:
        status, _, out = infer(srv, {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [big]}]},
                               "digits_image")
        assert status == 413 and "decoding its images" in out["error"] and "max_request_bytes" in out["error"], out
        assert out["error"].endswith("send fewer pictures per request, or smaller ones (their pixels count, "
                                     "not their files' bytes, and their metadata: ICC profiles, EXIF, "
                                     "comments)"), out
        status, _, out = infer(srv, {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2],
                                                 "data": [small, small]}]}, "digits_image")
        assert status == 200, out
        status, _, raw = request(srv, "GET", "/metrics")
        assert b"aclserve_request_memory_bytes 0.0" in raw  # the charge given back


def test_the_metadata_a_picture_carries_is_charged_to_the_request_memory(tmp_path):
    """A 32 x 32 JPEG carrying a 12 MB ICC profile: Pillow holds its parts and joins them (36 MB),
    where the picture's pixels were all its decode was charged (8 such at once took the RSS 500-700
    MB past their model's charge; found by tester t88). Sent as the raw body, it is a 413 under
    32 MiB, the same bytes after its end are not."""
    _digits_image_repository(tmp_path)
    config = server_config(tmp_path, images={"workers": 2}, max_request_bytes=32 << 20, max_body_bytes=16 << 20)
    plain = encode(np.zeros((32, 32), np.uint8), "JPEG")
    profile = np.random.default_rng(0).bytes(12 << 20)
    size = 0xFFFF - 2 - 14
    parts = [profile[k:k + size] for k in range(0, len(profile), size)]
    icc = b"".join(b"\xff\xe2" + struct.pack(">H", len(part) + 16) + b"ICC_PROFILE\0" + bytes((i + 1, len(parts)))
                   + part for i, part in enumerate(parts))
    headers = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    with ServerThread(config) as srv:
        status, _, raw = request(srv, "POST", "/v2/models/digits_image/infer", data=plain[:2] + icc + plain[2:],
                                 headers=headers)
        assert status == 413, raw[:200]
        out = json.loads(raw)
        assert "decoding its images" in out["error"] and "metadata" in out["error"], out
        status, _, raw = request(srv, "POST", "/v2/models/digits_image/infer", data=plain + bytes(len(icc)),
                                 headers=headers)
        assert status == 200, raw  # the same bytes after its end are not read: not charged


def test_photos_sent_at_once_are_charged_the_size_libjpeg_decodes_them_to(tmp_path):
    """16 clients at once, each with a 12-megapixel baseline JPEG for the 8x8 digits model, under
    the default memory limits: each decodes at 1/8 a side, and is charged so (5 of the 16 got
    503 while a JPEG was charged 4 bytes a full-size pixel; found by an independent review)."""
    _digits_image_repository(tmp_path)
    y, x = np.mgrid[0:3000, 0:4000]
    photo = encode(np.stack([(x + y) % 256] * 3, -1).astype(np.uint8), "JPEG", quality=90)
    with ServerThread(server_config(tmp_path, max_body_bytes=64 << 20)) as srv:
        async def one(session):
            async with session.post(f"http://{srv.url}/v2/models/digits_image/infer", data=io.BytesIO(photo),
                                    headers={"Inference-Header-Content-Length": "0"}) as response:
                await response.read()
                return response.status

        async def together():
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(*[one(session) for _ in range(16)])
        assert asyncio.run(together()) == [200] * 16
        status, _, raw = request(srv, "GET", "/metrics")
        assert b"aclserve_request_memory_bytes 0.0" in raw
