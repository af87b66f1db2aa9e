"""`Expect: 100-continue` answered with the final status where the request's head alone decides it
(infer.expect_body, body.refuse_from_head): the same status and message as the whole request gets,
and the connection closed, saying so. And a 413 sent before the body has all come says
`Connection: close`, as the connection then closes. A real server (CPU runtime), raw sockets."""
from __future__ import annotations

import asyncio

import pytest

from tests.serving import ServerThread

from .hostile import head, open_raw

JSON_LIMIT = 1024
GOOD = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": '
        b'[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}]}')


@pytest.fixture(scope="module")
def srv(models_dir, make_config):
    with ServerThread(make_config(models_dir, max_json_bytes=JSON_LIMIT)) as server:
        yield server


async def _answer(reader) -> tuple[int, list[bytes], bytes]:
    """(status, header lines lowercased, body) of the next answer."""
    status_line, *lines = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
    lines = [line.lower() for line in lines]
    length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), 0)
    return int(status_line.split()[1]), lines, await reader.readexactly(length)


async def _asked(url: str, path: str, headers: dict) -> tuple[int, list[bytes], bytes, bytes]:
    """The answer to a head that expects 100-continue (no body byte sent), and, for a refusal,
    what comes after the client sends its body anyway and a good request behind it (b"": the
    connection closed, as the refusal said)."""
    reader, writer = await open_raw(url)
    writer.write(head(path, {**headers, "Expect": "100-continue"}))
    status, lines, body = await _answer(reader)
    after = b""
    if status != 100:
        writer.write(b"x" * int(headers["Content-Length"]) + head("/v2/models/double/infer",
                                                                  {"Content-Length": len(GOOD)}) + GOOD)
        after = await reader.read()  # up to the server's close
    writer.close()
    return status, lines, body, after


async def _sent_whole(url: str, path: str, headers: dict) -> tuple[int, bytes]:
    reader, writer = await open_raw(url)
    writer.write(head(path, headers) + b"x" * int(headers["Content-Length"]))
    status, _, body = await _answer(reader)
    writer.close()
    return status, body


CASES = {
    "unknown model": ("/v2/models/nosuch/infer", {"Content-Length": 2000}),
    "unknown version": ("/v2/models/double/versions/9/infer", {"Content-Length": 2000}),
    "content encoding": ("/v2/models/double/infer", {"Content-Length": 2000, "Content-Encoding": "br"}),
    "json part too large": ("/v2/models/double/infer", {"Content-Length": 4000,
                                                        "Inference-Header-Content-Length": 3000}),
    "json part past the body": ("/v2/models/double/infer", {"Content-Length": 500,
                                                            "Inference-Header-Content-Length": 600}),
    "header not a number": ("/v2/models/double/infer", {"Content-Length": 500,
                                                        "Inference-Header-Content-Length": "12a"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_certain_to_fail_is_not_told_to_continue(srv, case):
    """A tester's find: 100 Continue was granted to requests the head already doomed (an unknown
    model or version, a Content-Encoding the server does not take, an
    Inference-Header-Content-Length over max_json_bytes), and the client uploaded its whole body
    only to get 404 / 415 / 413. Now the head gets that final answer, word for word, and the
    connection closes as it says: a request sent behind the body is not answered (the guard
    answered one directly after aiohttp's `Connection: close`)."""
    path, headers = CASES[case]
    status, lines, body, after = asyncio.run(_asked(srv.url, path, headers))
    whole_status, whole_body = asyncio.run(_sent_whole(srv.url, path, headers))
    assert status >= 400 and (status, body) == (whole_status, whole_body), (status, body, whole_status, whole_body)
    assert b"connection: close" in lines and after == b""


def test_a_request_that_may_succeed_is_told_to_continue(srv):
    """An Inference-Header-Content-Length within the limits, and one over max_json_bytes on a
    gzip body (its length is not known from the head), are told to continue."""
    for headers in ({"Content-Length": len(GOOD), "Inference-Header-Content-Length": len(GOOD)},
                    {"Content-Length": 4000, "Inference-Header-Content-Length": 3000, "Content-Encoding": "gzip"}):
        status, *_ = asyncio.run(_asked(srv.url, "/v2/models/double/infer", headers))
        assert status == 100, headers


def test_a_413_before_the_body_has_come_says_the_connection_closes(srv):
    """A tester's find: a body declared over max_json_bytes got its 413 at once, without
    `Connection: close`, and the connection was dropped later (the rest of the body is read
    and dropped for up to 10 s, then the connection closes unless all of it came). Now the
    answer says so, and the connection closes once the rest is read: a request sent behind it
    gets no answer."""
    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": 4000}) + b"x" * 100)
        status, lines, body = await _answer(reader)
        writer.write(b"x" * 3900 + head("/v2/models/double/infer", {"Content-Length": len(GOOD)}) + GOOD)
        rest = await reader.read()  # up to the server's close
        writer.close()
        return status, lines, body, rest
    status, lines, body, rest = asyncio.run(scenario())
    assert status == 413 and b"max_json_bytes" in body and b"connection: close" in lines
    assert rest == b""
