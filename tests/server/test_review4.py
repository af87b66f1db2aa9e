"""Review 4: the head memo (framing.parse_head), the early refusal's Head-memo reading of
Inference-Header-Content-Length (shedding._json_length), the body offered with its head.

Real server on a real port, raw sockets, the affine model with a queue of one place and a
batching window no test outlasts, so the queue is full without any test double (full_queue.py)."""
import asyncio

import pytest

from .full_queue import ONE_ROW, affine_server, fill_queue, refused_through_aiohttp
from .hostile import open_raw, read_response

HUGE = b"1" * 5000  # digits: int() of more than 4300 refuses them (sys.get_int_max_str_digits)


def infer_head(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (len(body), extra))


@pytest.fixture
def long_window(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config) as srv:
        yield srv


def _answer_while_overloaded(url: str, data: bytes):
    async def scenario():
        reader, writer = await fill_queue(url)
        refused_status, other = await refused_through_aiohttp(url)  # early refusals on
        r2, w2 = await open_raw(url)
        w2.write(data)
        try:
            status, answer = await read_response(r2)
        except ConnectionError:
            status, answer = 0, b""
        for w in (writer, other, w2):
            w.close()
        return refused_status, status, answer

    return asyncio.run(scenario())


@pytest.mark.parametrize("extra", [b"", b"Connection: close\r\n"], ids=["plain", "connection-close"])
def test_a_huge_inference_header_content_length_while_overloaded_is_answered(long_window, extra):
    """While the early refusal is on, a request whose Inference-Header-Content-Length is 5000
    digits: aiohttp's path answers it, 400 (codec.parse_header_length refuses more than 18
    digits before the request comes near the full queue). shedding._json_length called int() on
    the digits for every POST to a full queue, before it looked at anything else: the ValueError
    escaped the guard's data_received, and the connection was dropped without an answer. `connection-close` was
    never looked at by the early refusal before (the head is not plain): it is a regression of
    commit 0216e92; `plain` failed on the parent commit as well (int() after the body came).
    Fixed: a value of more than 18 digits is left to aiohttp, as framing leaves such a
    Content-Length."""
    body = ONE_ROW
    data = infer_head(body, b"Inference-Header-Content-Length: " + HUGE + b"\r\n" + extra) + body
    refused_status, status, answer = _answer_while_overloaded(long_window.url, data)
    assert refused_status == 503
    assert status == 400, f"not aiohttp's answer (0: the connection was dropped): {answer[:300]!r}"
    said = b"Inference-Header-Content-Length '" + HUGE[:40] + b"' is larger than any body"
    assert answer.endswith(b'{"error":"' + said + b'"}'), answer[:300]
    assert (b"\r\nConnection: close\r\n" in answer) == bool(extra)
