"""What a 413 for request memory (max_request_bytes) says of the request: the binary tensor
extension advised only to a body that does not use it already. A real server on a real port,
raw HTTP/1.1 requests (through the guard's direct path, through aiohttp's, and with
`Expect: 100-continue`)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.serving import ServerThread

from .hostile import metric, open_raw

KiB = 1 << 10
DIRECT = "aclserve_direct_infer_total"
JSON_ADVICE = "send tensors with the binary tensor extension or in smaller requests"


@pytest.fixture(scope="module")
def srv(models_dir, make_config):
    with ServerThread(make_config(models_dir, max_request_bytes=16 * KiB)) as srv:
        yield srv


def binary_body(rows: int) -> tuple[bytes, dict]:
    raw = np.ones((rows, 16), np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 16],
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def json_body(rows: int) -> tuple[bytes, dict]:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 16], "data": [1.0] * (rows * 16)}]}
    return json.dumps(doc).encode(), {}


async def answer_to(url: str, body: bytes, headers: dict) -> tuple[int, str]:
    """(status, error) of one POST to double's infer route; with `Expect: 100-continue` among
    `headers` the body is not sent (the server refuses from the head)."""
    lines = ["POST /v2/models/double/infer HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    reader, writer = await open_raw(url)
    try:
        sent = b"" if "Expect" in headers else body
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + sent)  # (one write: the direct path's)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        payload = await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]), json.loads(payload)["error"]


WAYS = {"direct": {}, "aiohttp": {"Accept-Encoding": "identity"}, "expect": {"Expect": "100-continue"}}


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("binary", [True, False], ids=["binary body", "JSON body"])
def test_the_binary_extension_is_advised_to_a_json_body_only(srv, way, binary):
    """A body already in the binary extension was told "send tensors with the binary tensor
    extension or in smaller requests" (a tester): the lease's advice was the JSON body's
    whatever the body. 20 KiB of body against max_request_bytes of 16 KiB, each way in."""
    body, headers = binary_body(320) if binary else json_body(6)
    body += b" " * (20 * KiB - len(body)) if not binary else b""
    assert 16 * KiB < len(body) < 24 * KiB
    direct = metric(srv.url, DIRECT)
    status, error = asyncio.run(answer_to(srv.url, body, {**headers, **WAYS[way]}))
    assert status == 413 and "(max_request_bytes)" in error, error
    assert error.endswith("; send smaller requests" if binary else f"; {JSON_ADVICE}"), error
    assert (metric(srv.url, DIRECT) > direct) == (way == "direct")  # (the way taken is the one named)
