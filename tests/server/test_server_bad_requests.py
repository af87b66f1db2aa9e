"""Bad requests to the real server get a 4xx whose message says what is wrong, not a traceback:
malformed bodies and parameters, integers past 64 bits quoted as sent, bodies past their limits
(413, one before it is sent), a header byte that is not UTF-8, a client gone before its 100
Continue; an unexpected exception is a generic 500."""
import asyncio
import json
import socket

import numpy as np
import pytest

from tests.serving import request

from .affine_requests import doc, infer_json


BAD = [
    (b"{not json", None, 400, "not valid JSON"),
    ({"inputs": [dict(doc()["inputs"][0], datatype="FP64"), doc()["inputs"][1]]}, None, 400, "datatype"),
    (doc(x=np.zeros((2, 5), np.float32)), None, 400, "shape"),
    ({"inputs": doc()["inputs"][:1]}, None, 400, "missing input"),
    (doc(parameters={"priority": -3}), None, 400, "priority"),
    (doc(parameters={"priority": "high"}), None, 400, "priority"),
    (doc(outputs=[{"name": "zz"}]), None, 400, "unknown output"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "parameters": {"binary_data_size": 32}},
                 doc()["inputs"][1]]}, "binary", 400, "binary_data_size 32 does not match"),
    (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, 400, "nested too deeply"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [NaN, 0, 0, 0, 0, 0, 0, 0]}]}',
     None, 400, "NaN is not valid JSON"),
    (b"\xff\xfe{}", None, 400, "not valid JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0, 0, 1e400, 0, 0, 0, 0, 0]}]}',
     None, 400, "input 'x': data values out of range for FP32"),
    (doc(parameters={"pad": "a" * (800 << 10)}), None, 413, "max_json_bytes"),
    (json.dumps(doc(parameters={"junk": [0] * 300_000}), separators=(",", ":")).encode(), None, 413,
     "max_json_elements"),
]


@pytest.mark.parametrize("body,mode,status,match", BAD)
def test_bad_requests_get_400_with_message(server, body, mode, status, match):
    headers = {}
    if mode == "binary":
        head = json.dumps(body).encode()
        headers = {"Inference-Header-Content-Length": str(len(head))}
        body = head + b"\0" * 32
    got, resp_headers, raw = infer_json(server, body, headers)
    assert got == status and resp_headers["Content-Type"].startswith("application/json")
    assert match in json.loads(raw)["error"]


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value,shown", [("18446744073709551616", "18446744073709551616"),
                                         ("-9223372036854775809", "-9223372036854775809"),
                                         ("1" + "0" * 60, "an integer of 61 digits"), ("1e30", "1e+30"),
                                         # (a string of digits is taken up to 2**64 - 1: past it, the bound said)
                                         ('"18446744073709551616"', '"18446744073709551616"')],
                         ids=["2**64", "below-int64", "61-digits", "1e30", "string-2**64"])
@pytest.mark.parametrize("padding", [0, 2048], ids=["small", "simdjson"])  # (a JSON part of 2 KB or more)
def test_an_integer_parameter_out_of_range_is_quoted_as_sent(server, key, value, shown, padding):
    """The JSON decoders read an integer beyond 64 bits as a float: `"priority": 2**64` was
    refused "got 1.8446744073709552e+19" (a tester). Its digits now, cut as long values are."""
    body = json.dumps(doc(id="r" * padding, parameters={key: 0})).replace(f'"{key}": 0', f'"{key}": {value}').encode()
    status, _, raw = infer_json(server, body)
    expected = f"parameters.{key} must be an unsigned 64-bit integer (at most {2**64 - 1}), got {shown}"
    assert status == 400 and json.loads(raw)["error"] == expected


def test_digits_of_another_objects_parameter_are_not_quoted_for_the_requests(server):
    """An output's `priority` of another number the same float could be: the request's is not
    told it as its own (a reviewer); the float it was read as is shown instead."""
    body = json.dumps(doc(parameters={"priority": 0}, outputs=[{"name": "y", "parameters": {"priority": 0}}]))
    body = body.replace('"priority": 0}}', '"priority": 18446744073709551999}}', 1)
    body = body.replace('"priority": 0', '"priority": 18446744073709551616', 1).encode()
    status, _, raw = infer_json(server, body)
    assert status == 400 and json.loads(raw)["error"].endswith("got 1.8446744073709552e+19"), raw


def test_a_body_that_does_not_decompress_is_a_400(server):
    status, _, raw = infer_json(server, b"this is not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "content-encoding" in json.loads(raw)["error"].lower()
    assert infer_json(server, doc())[0] == 200  # still serving


def test_binary_chunk_size_mismatch(server):
    head = json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 8], "parameters": {"binary_data_size": 32}},
        {"name": "idx", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]}).encode()
    for extra in (b"\0" * 50, b"\0" * 60):
        status, _, raw = infer_json(server, head + extra, {"Inference-Header-Content-Length": str(len(head))})
        assert status == 400 and "bytes" in json.loads(raw)["error"]


def test_oversize_body_413(server):
    status, _, raw = infer_json(server, b"[" + b"0," * (600 * 1024) + b"0]")  # all JSON: max_json_bytes is lower
    error = json.loads(raw)["error"]
    assert status == 413 and "786432 bytes (max_json_bytes; send large tensors with the binary" in error
    status, _, raw = infer_json(server, b"{}" + b"\0" * (1100 << 10), {"Inference-Header-Content-Length": "2"})
    assert status == 413 and "max_body_bytes" in json.loads(raw)["error"]
    assert infer_json(server, doc())[0] == 200  # still serving


def test_a_json_body_over_max_json_bytes_is_refused_before_it_is_sent(server):
    """900 KB declared (max_json_bytes 768 KiB, max_body_bytes 1 MiB), nothing of it sent: a body
    that is all JSON (no Inference-Header-Content-Length) is refused from its Content-Length at
    once, not read and charged to the memory budget to be refused then (waiting for it, the
    server's body timeout answered 408)."""
    async def exchange():
        reader, writer = await asyncio.open_connection(*server.url.split(":"))
        writer.write(f"POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {900 << 10}\r\n\r\n"
                     .encode())
        try:
            return await asyncio.wait_for(reader.readline(), 120)  # a hang guard
        finally:
            writer.close()
    assert b" 413 " in asyncio.run(exchange())


def test_a_control_body_over_its_route_limit_names_that_limit(server):
    """The trace and repository routes take at most 64 KiB and 1 MiB (or max_body_bytes when
    lower): a 413 names the limit that applies, not max_body_bytes, which raising would not
    help (a 100 KB trace setting was told the limit was max_body_bytes)."""
    from aclserve.server.body import body_limit
    status, _, raw = request(server, "POST", "/v2/trace/setting", data=b" " * (100 << 10))
    error = json.loads(raw)["error"]
    assert status == 413 and "65536 bytes (the trace setting API's limit)" in error and "max_body_bytes" not in error
    assert body_limit(64 << 20, 1 << 20, "the repository API's limit") == (1 << 20, "the repository API's limit")
    assert body_limit(1 << 19, 1 << 20, "the repository API's limit") == (1 << 19, "max_body_bytes")
    assert request(server, "GET", "/v2/trace/setting")[0] == 200  # still serving


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/repository/index"])
def test_a_header_byte_that_is_not_utf8_is_quoted_in_a_json_error_not_a_500(server, path):
    """aiohttp decodes header values as UTF-8 with surrogateescape, so `Expect: \\xff` reached the
    417's message as a lone surrogate, which orjson cannot write: a plain-text 500 and an ERROR
    with a traceback instead of the JSON 417."""
    from .hostile import open_raw, read_response

    async def scenario():
        reader, writer = await open_raw(server.url)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n".encode()
                     + b"Expect: \xff100-continue\r\n\r\n{}")
        status, answer = await read_response(reader)
        writer.close()
        return status, answer
    status, answer = asyncio.run(scenario())
    assert status == 417, answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "unknown expectation: Expect: \\udcff100-continue"}


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/repository/index"])
def test_a_client_gone_before_its_100_continue_leaves_no_traceback(server, path, caplog):
    """Head, `Expect: 100-continue` and body sent at once, then the connection closed: writing
    "100 Continue" to the closed transport raised out of the expect handler, and aiohttp logged an
    ERROR with a 20-line traceback for each such client (found by an attacker's re-test)."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    host, port = server.url.rsplit(":", 1)
    for _ in range(20):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head + body)
    status, _, _ = request(server, "GET", "/v2/health/live")  # after the 20 were handled
    assert status == 200
    assert "Error handling request" not in caplog.text and "Traceback" not in caplog.text


def test_unexpected_exception_is_a_generic_500(caplog):
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from aclserve.errors import QueueFull
    from aclserve.server.error_responses import error_middleware

    async def boom(request):
        raise RuntimeError("secret detail")

    async def full(request):
        raise QueueFull("queue is full")

    async def go():
        app = web.Application(middlewares=[error_middleware])
        app.router.add_get("/boom", boom)
        app.router.add_get("/full", full)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/boom")
            assert resp.status == 500 and await resp.json() == {"error": "internal error"}
            resp = await client.get("/full")
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert await resp.json() == {"error": "queue is full"}
    asyncio.run(go())
    assert "secret detail" in caplog.text
