"""What a 413 for request memory (max_request_bytes) says of the request: the binary tensor
extension advised where the memory charged is JSON tensor data (a body all JSON; decoding a JSON
part that carries `data`, whatever the framing), smaller requests where the tensors are binary;
and "more than" what a body came to where its whole size is not known (inflating, or of no
declared length). A real server on a
real port, raw HTTP/1.1 requests (through the guard's direct path, through aiohttp's, and with
`Expect: 100-continue`) and aiohttp's client (gzip and chunked bodies)."""
from __future__ import annotations

import asyncio
import io
import json
import re
import zlib

import aiohttp
import numpy as np
import pytest

from tests.serving import ServerThread, request

from .hostile import metric, open_raw

KiB, MiB = 1 << 10, 1 << 20
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


def mixed_body(rows: int) -> tuple[bytes, dict]:
    """A body framed for the binary tensor extension (Inference-Header-Content-Length) whose
    tensor is JSON `data` in its JSON part all the same, as the extension allows."""
    body, _ = json_body(rows)
    return body, {"Inference-Header-Content-Length": str(len(body))}


async def answer_to(url: str, body: bytes, headers: dict) -> tuple[int, str]:
    """(status, error) of one POST to double's infer route; with `Expect: 100-continue` among
    `headers` the body is sent only once the server says to continue (it may refuse from the head)."""
    lines = ["POST /v2/models/double/infer HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    reader, writer = await open_raw(url)
    try:
        sent = b"" if "Expect" in headers else body
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + sent)  # (one write: the direct path's)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if head.startswith(b"HTTP/1.1 100 "):
            writer.write(body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        payload = await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]), json.loads(payload).get("error", "")


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


@pytest.fixture(scope="module")
def tight(models_dir, make_config):
    """max_request_bytes of 8 KiB: double's 8 rows (its max_batch_size) fit as binary tensors,
    not as JSON values (64 bytes each to decode)."""
    with ServerThread(make_config(models_dir, max_request_bytes=8 * KiB)) as srv:
        yield srv


@pytest.mark.parametrize("way", sorted(WAYS))
def test_json_data_in_a_binary_framed_body_is_advised_the_binary_extension(tight, way):
    """A reviewer's find: a body sent with Inference-Header-Content-Length but its tensor as JSON
    `data` (under 1 KB here), refused for decoding that JSON, was told "send smaller requests":
    the advice followed the framing, not where the memory goes. Sent binary, the same rows fit."""
    body, headers = mixed_body(8)
    assert len(body) < KiB
    status, error = asyncio.run(answer_to(tight.url, body, {**headers, **WAYS[way]}))
    assert status == 413 and "(decoding its JSON)" in error and error.endswith(f"; {JSON_ADVICE}"), error
    body, headers = binary_body(8)
    assert asyncio.run(answer_to(tight.url, body, {**headers, **WAYS[way]}))[0] == 200


@pytest.mark.parametrize("way", sorted(WAYS))
def test_decoding_the_json_part_of_a_binary_body_is_advised_smaller_requests(srv, way):
    """A body whose tensor is binary, its body and the decoding of its small JSON part together
    over max_request_bytes: refused for decoding its JSON, it is told to send smaller requests,
    not to use the extension it uses (the JSON part carries no tensor data)."""
    body, headers = binary_body(250)
    assert len(body) < 16 * KiB
    status, error = asyncio.run(answer_to(srv.url, body, {**headers, **WAYS[way]}))
    assert status == 413 and "(decoding its JSON)" in error and error.endswith("; send smaller requests"), error


@pytest.fixture(scope="module")
def roomy(models_dir, make_config):
    """max_request_bytes of 1.5 MiB under bodies of up to 8 MiB, all JSON too (as the tester's)."""
    with ServerThread(make_config(models_dir, max_request_bytes=3 * MiB // 2, max_body_bytes=8 * MiB,
                                  max_json_bytes=8 * MiB, max_inflate_ratio=0)) as srv:
        yield srv


def padded_json(nbytes: int) -> bytes:
    body, _ = json_body(1)
    return body + b" " * (nbytes - len(body))


async def post_streamed(url: str, body: bytes, gzip: bool) -> tuple[int, str]:
    """POST `body` gzipped (Content-Encoding), or plain with no declared length (chunked)."""
    async def chunks():
        for at in range(0, len(body), 64 * KiB):
            yield body[at:at + 64 * KiB]
    if gzip:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        data, headers = io.BytesIO(packer.compress(body) + packer.flush()), {"Content-Encoding": "gzip"}
    else:
        data, headers = chunks(), {}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{url}/v2/models/double/infer", data=data, headers=headers) as resp:
            return resp.status, (await resp.json())["error"]


@pytest.mark.parametrize("gzip", [True, False], ids=["gzip", "chunked"])
def test_a_body_whose_size_is_not_known_needs_more_than_it_came_to(roomy, gzip):
    """A gzip body inflating to 5 MiB was refused "request needs about 2.0 MiB of server memory
    (decompressed request body)": 2.0 MiB was what had been inflated when the 1.5 MiB limit was
    crossed, not the need (a tester). A body of no declared length said the same of what had come."""
    status, error = asyncio.run(post_streamed(roomy.url, padded_json(5 * MiB), gzip))
    what = "decompressed request body" if gzip else "request body"
    match = re.fullmatch(rf"request needs more than ([0-9.]+) MiB of server memory \({what}\), over the "
                         rf"per-request limit of 1\.5 MiB \(max_request_bytes\); {re.escape(JSON_ADVICE)}", error)
    assert status == 413 and match, error
    assert 1.5 < float(match.group(1)) < 5


def test_a_body_of_declared_length_needs_about_its_length(roomy):
    body = padded_json(2 * MiB)
    status, _, answer = request(roomy, "POST", "/v2/models/double/infer", data=body)
    assert status == 413 and json.loads(answer)["error"].startswith(
        "request needs about 2.0 MiB of server memory (request body), over the per-request limit of 1.5 MiB"), answer
