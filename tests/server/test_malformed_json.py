"""Requests aiohttp's parser refuses get the server's JSON error shape, naming the problem, and
the connection closed (server/malformed.py): they got aiohttp's plain-text 400, the one answer
not in the KServe v2 shape. The real server (its guard in front of aiohttp), raw sockets."""
from __future__ import annotations

import json
import socket

import pytest

from aclserve.server.malformed import PURE_PYTHON_PARSER
from tests.serving import ServerThread, free_port, server_config

HEAD = b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: t\r\n"
CASES = {
    "header over 8190 bytes": (b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
                               "the request line or a header is over 8190 bytes"),
    "target over 8190 bytes": (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n",
                               "the request line or a header is over 8190 bytes"),
    "Content-Length twice": (HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "Duplicate Content-Length"),
    "Content-Length not a number": (HEAD + b"Content-Length: abc\r\n\r\n", "Invalid character in Content-Length"),
    "request line of four parts": (b"GET /v2/health/ready HTTP/1.1 extra\r\nHost: t\r\n\r\n",
                                   "Bad status line: Expected CRLF after version"),
    "unknown HTTP version": (b"GET / HTTP/9.9\r\nHost: t\r\n\r\n", "Bad status line: Invalid HTTP version"),
    "TLS to the HTTP port": (b"\x16\x03\x01\x00\x05hello\r\n\r\n", "Received HTTPS traffic on an HTTP port"),
    "space before the colon": (b"GET / HTTP/1.1\r\nHost : t\r\n\r\n", "Invalid header token (header 'Host')"),
    # a gRPC client pointed at the HTTP port (its answer said only "Pause on PRI/Upgrade"); gRPC is off here
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "an HTTP/2 connection preface (a gRPC client's?) came "
                       "to this port, which speaks HTTP/1.1; gRPC is off on this server (grpc_port 0)"),
    # (llhttp takes PRI for HTTP/2's preface alone; its refusal quotes the next line, named as a header's once)
    "PRI as an HTTP/1.1 method": (b"PRI / HTTP/1.1\r\nHost: t\r\n\r\n",
                                  "Bad status line: Expected HTTP/2 Connection Preface"),
    "more than 128 headers": (b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(130))
                              + b"\r\n", "Too many headers received"),
}


@pytest.fixture(scope="module")
def srv(models_dir):
    # a keep-alive far past the read bound below: a connection left open is seen as open
    with ServerThread(server_config(models_dir, keepalive_timeout_s=120)) as server:
        yield server


def until_closed(url: str, data: bytes) -> bytes:
    """All the server writes until it closes the connection (fails if it has not in 20 s)."""
    host, port = url.rsplit(":", 1)
    out = b""
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(data)
        while chunk := s.recv(65536):  # socket.timeout: left open
            out += chunk
    return out


def answers(raw: bytes) -> list[tuple[int, str, bytes]]:
    """(status, Content-Type, body) of each answer in `raw`, read by Content-Length."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.decode().lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        found.append((int(lines[0].split()[1]), headers["content-type"], rest[:length]))
        raw = rest[length:]
    return found


@pytest.mark.parametrize("data, named", CASES.values(), ids=CASES.keys())
def test_a_request_the_parser_refuses_gets_a_json_400_naming_it_and_is_closed(srv, data, named):
    [(status, content_type, body)] = answers(until_closed(srv.url, data))
    assert (status, content_type) == (400, "application/json"), body
    assert json.loads(body) == {"error": f"malformed HTTP request: {named}"}


@pytest.mark.skipif(PURE_PYTHON_PARSER, reason="the pure-Python parser has no words of its own for HTTP/2's preface")
def test_an_http2_client_at_the_http_port_is_told_the_grpc_port(models_dir):
    grpc_port = free_port()
    with ServerThread(server_config(models_dir, grpc_port=grpc_port)) as server:
        [(status, _, body)] = answers(until_closed(server.url, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    assert status == 400 and json.loads(body)["error"].endswith(f"speaks HTTP/1.1; gRPC is on port {grpc_port}")


def test_a_request_before_the_malformed_one_is_answered_and_the_refusal_quotes_no_token(srv):
    """The client's bytes are not echoed: a header value may be a credential."""
    data = (b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /v2 HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer s3cret\x01\r\n\r\n")
    first, refused = answers(until_closed(srv.url, data))
    assert first[:2] == (200, "application/json")
    assert refused[:2] == (400, "application/json") and b"s3cret" not in refused[2]
    assert json.loads(refused[2]) == {"error": "malformed HTTP request: Invalid header value char "
                                                "(header 'Authorization')"}


def test_the_pure_python_parsers_refusals_quote_none_of_the_clients_bytes():
    """aiohttp's pure-Python parser (AIOHTTP_NO_EXTENSIONS, or no wheel for the platform) quotes
    the client's bytes plainly or gives them as the message, where the C parser marks them b'...':
    an independent review saw a token in the request line come back in the 400."""
    from aiohttp import http_exceptions as refused

    from aclserve.server.malformed import problem

    for exc, words in ((refused.BadStatusLine("GET /v2?token=SECRET1 HTTP/1.1 extra"), "bad request line"),
                       (refused.TransferEncodingError("SECRET3"), "bad chunked encoding"),
                       (refused.BadHttpMethod("G\x01SECRET"), "bad method"),
                       (refused.InvalidURLError("/SECRET"), "bad request target"),
                       (refused.InvalidHeader(b"X-Key: SECRET"), "Invalid HTTP header")):
        said = problem(400, exc, pure_python=True)
        assert "SECRET" not in said and said.startswith(f"malformed HTTP request: {words}"), said
