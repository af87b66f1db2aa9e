"""A request that ends its connection (`Connection: close`, RFC 9112 9.6) is answered, then the
connection closes and what was pipelined after it is ignored. Found by a tester: a keep-alive
infer, a `Connection: close` one and a third written at once were answered 200, then
`HTTP/1.0 400 {"error":"malformed HTTP request: Data after `Connection: close`"}`: aiohttp's
parser refuses any byte after such a request, and the answers due from that read, the closing
request's included, were lost. Real server on a real port, raw blocking sockets: the answers
that come, then EOF. Both with the guard's answers on (default) and with the guard only framing
(direct_infer and shed_before_parsing off)."""
from __future__ import annotations

import json
import socket

import pytest

from tests.serving import ServerThread, server_config

from .hostile import metric
from .test_direct_infer import JSON_BODY, VIA_AIOHTTP, binary_body, post

DIRECT = "aclserve_direct_infer_total"
INFER = "/v2/models/double/infer"
CLOSE = {"Connection": "close"}
GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n%s\r\n"


@pytest.fixture(scope="module", params=["guard answers", "framing only"])
def srv(request, models_dir):
    offers = {} if request.param == "guard answers" else {"direct_infer": False, "shed_before_parsing": False}
    with ServerThread(server_config(models_dir, model_control_mode="none", **offers)) as s:
        s.direct = request.param == "guard answers"
        yield s


def until_closed(url: str, data: bytes, first: bytes = b"") -> list[tuple[bytes, dict, bytes]]:
    """Write `first` and read its answer (when given), then write `data` at once and read until
    the server closes: each answer's (status line, headers with lower-case names, body)."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:  # the timeout: a hang guard
        got = b""
        if first:
            sock.sendall(first)
            while not answers_in(got) and (chunk := sock.recv(65536)):
                got += chunk
        sock.sendall(data)
        while chunk := sock.recv(65536):
            got += chunk
    return answers_in(got)


def answers_in(got: bytes) -> list[tuple[bytes, dict, bytes]]:
    """The whole answers at the start of `got`."""
    answers = []
    while b"\r\n\r\n" in got:
        head, rest = got.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
        length = int(headers[b"content-length"])
        if len(rest) < length:
            break
        answers.append((status, headers, rest[:length]))
        got = rest[length:]
    return answers


def outputs(answer) -> list:
    return json.loads(answer[2])["outputs"][0]["data"]


def test_a_pipelined_infer_that_closes_is_answered_then_the_connection_closes(srv):
    """On the guard's direct path: the keep-alive infer and the closing one both answered there."""
    before = metric(srv.url, DIRECT)
    answers = until_closed(srv.url, post(INFER, JSON_BODY) + post(INFER, JSON_BODY, CLOSE) + post(INFER, JSON_BODY))
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 2, answers
    assert b"connection" not in answers[0][1] and answers[1][1][b"connection"] == b"close"
    assert outputs(answers[0]) == outputs(answers[1]) == [2 * v for v in range(16)]
    assert metric(srv.url, DIRECT) == before + (2 if srv.direct else 0)


def test_a_closing_infer_through_aiohttp_is_answered_then_the_connection_closes(srv):
    """A request that is not plain (Accept-Encoding) goes through aiohttp, with a binary output."""
    body, header_length = binary_body()
    extra = dict(VIA_AIOHTTP, **{"Inference-Header-Content-Length": str(header_length)})
    before = metric(srv.url, DIRECT)
    answers = until_closed(srv.url, post(INFER, body, dict(extra, **CLOSE)) + post(INFER, body, extra))
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"], answers
    assert answers[0][1][b"connection"] == b"close"
    assert answers[0][1][b"content-type"] == b"application/octet-stream"
    assert metric(srv.url, DIRECT) == before


@pytest.mark.parametrize("closing", [b"Connection: close\r\n", b"Proxy-Connection: Close\r\n",
                                     b"Connection: keep-alive\r\nConnection: close\r\n"])
def test_a_closing_get_followed_by_another_is_answered_then_the_connection_closes(srv, closing):
    answers = until_closed(srv.url, GET_LIVE % closing + GET_LIVE % b"")
    assert [(a[0], a[2]) for a in answers] == [(b"HTTP/1.1 200 OK", b'{"live":true}')], answers


def test_an_http_1_0_request_ends_its_connection_unless_kept_alive(srv):
    get = GET_LIVE.replace(b"HTTP/1.1", b"HTTP/1.0")
    answers = until_closed(srv.url, get % b"" + get % b"")
    assert [a[0] for a in answers] == [b"HTTP/1.0 200 OK"], answers
    answers = until_closed(srv.url, get % b"Connection: keep-alive\r\n" + get % b"")
    assert [a[0] for a in answers] == [b"HTTP/1.0 200 OK"] * 2, answers


LIVE_WITH = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n%s\r\n"
ZERO_PADDED = post(INFER, JSON_BODY).replace(b"Content-Length: ", b"Content-Length: " + b"0" * 17, 1)
VALID_HEADS_ONCE_GIVEN_UP = {  # (the request, whether the guard answers it itself)
    "a value holding ' :'": (LIVE_WITH % b"X-Note: a : b\r\nUser-Agent: curl :8\r\n", False),
    "HTTP/1.0 without Host": (b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),
    "an empty line before it": (b"\r\n" + GET_LIVE % b"", False),
    "a Content-Length of 20 digits, zeros first": (ZERO_PADDED, True),
    "Upgrade without Connection: upgrade": (LIVE_WITH % b"Upgrade: websocket\r\n", False),
}


@pytest.mark.parametrize("name", list(VALID_HEADS_ONCE_GIVEN_UP))
def test_a_valid_head_the_guard_gave_up_on_is_framed_so_a_later_closing_request_is_answered(srv, name):
    """A tester (t90): the guard gave up framing the connection at these heads, so aiohttp's
    parser had a closing request and the one after it in one read and answered its 400 `Data
    after Connection: close` in place of both answers, and the connection's later plain infer
    requests were not answered by the guard. Framed as aiohttp's parser frames them: each is
    answered; then, pipelined, the closing infer (by the guard when it answers) and nothing after."""
    case, answered_here = VALID_HEADS_ONCE_GIVEN_UP[name]
    closing = post(INFER, JSON_BODY, CLOSE)
    for first, then, direct in ((b"", case + closing, 2 if answered_here else 0),  # (aiohttp had the case unanswered)
                                (case, closing, 2 if answered_here else 1)):
        before = metric(srv.url, DIRECT)
        answers = until_closed(srv.url, then + GET_LIVE % b"", first=first)
        assert [a[0].split(b" ", 1)[1] for a in answers] == [b"200 OK"] * 2, answers
        assert answers[1][1][b"connection"] == b"close" and outputs(answers[1]) == [2 * v for v in range(16)]
        assert metric(srv.url, DIRECT) == before + (direct if srv.direct else 0)
