"""The image tests' pictures and calls (test_server_images*.py): held-out digits (DIGITS) drawn as
PNGs, a JSON infer request's status, headers and answer, and base64 text of a file's bytes."""
from __future__ import annotations

import base64
import json
import os

import numpy as np
from PIL import Image

from tests import REPO
from tests.images.images_data import encode
from tests.serving import request

DIGITS = np.load(os.path.join(REPO, "tests", "data", "digits_test.npz"))


def digit_png(values: np.ndarray, size: int, dark_on_light: bool = False, resample=Image.NEAREST) -> bytes:
    """One held-out 8x8 digit (0-16) rendered as a grey PNG of size x size."""
    pixels = (values.reshape(8, 8) * 255 / 16).round().astype(np.uint8)
    if dark_on_light:
        pixels = 255 - pixels
    return encode(np.asarray(Image.fromarray(pixels).resize((size, size), resample)))


def infer(server, body: dict, model: str):
    status, headers, raw = request(server, "POST", f"/v2/models/{model}/infer", data=json.dumps(body).encode())
    return status, headers, json.loads(raw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
