"""Heads still without their blank line that no ending can make ones aiohttp takes: the
connection guard hands them to aiohttp, which answers 400 at once. The guard read only their
request line and held the rest until the header timeout closed the connection unanswered (10 s
by default; a tester's scripts, against the guard and against aiohttp alone, which answered 400
at once). Real server on a real port, raw sockets; its header timeout is 60 s, and each answer is
awaited 20 s at most (a hang guard: without the answer the read ends empty-handed)."""
import re
import socket
import time

import pytest

from tests.serving import ServerThread, server_config

from .hostile import metric
from .test_direct_infer import DIRECT, JSON_BODY

INFER = b"POST /v2/models/double/infer HTTP/1.1\r\nHost: t\r\n"
UNFINISHED = {
    "the blank line forgotten before a JSON body": INFER + b"Content-Type: application/json\r\n"
                                                   b"Content-Length: %d\r\n%s" % (len(JSON_BODY), JSON_BODY),
    "a header line over 8190 bytes": INFER + b"X: " + b"a" * 9000,
    "a NUL in a value": INFER + b"X: a\x00b\r\n",
    "a space before the colon": INFER + b"Content-Length : 5\r\n",
    "130 headers": INFER + b"".join(b"X%d: 1\r\n" % i for i in range(130)),
    "a bare CR in a value": INFER + b"X: a\rb\r\nContent-Length: 5\r\n",
    "a request line over 8190 bytes": b"GET /" + b"a" * 9000,
}


@pytest.fixture(scope="module")
def guarded(models_dir):
    with ServerThread(server_config(models_dir, model_control_mode="none", header_timeout_s=60)) as srv:
        yield srv


def connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def everything(sock: socket.socket) -> bytes:
    """What the server writes until it closes; what came by then if 20 s pass first."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (socket.timeout, ConnectionError):
        pass
    return out


@pytest.mark.parametrize("name", list(UNFINISHED))
def test_an_unfinished_head_aiohttp_refuses_is_answered_400_before_the_header_timeout(guarded, name):
    with connect(guarded.url) as sock:
        sock.sendall(UNFINISHED[name])
        answer = everything(sock)
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]


def test_a_sound_head_sent_a_byte_at_a_time_is_still_answered_by_the_guard(guarded):
    """The lines read as they come are not mistaken for bad ones: the request is answered, and
    directly (the guard did not give the connection up to aiohttp; it answers directly a
    request whose body comes with the end of its head)."""
    before = metric(guarded.url, DIRECT)
    request = INFER + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(JSON_BODY) + JSON_BODY
    with connect(guarded.url) as sock:
        for i in range(len(request) - len(JSON_BODY) - 1):
            sock.sendall(request[i:i + 1])
            time.sleep(0.002)  # one read each, mostly: not a timing check
        sock.sendall(request[-len(JSON_BODY) - 1:])
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert metric(guarded.url, DIRECT) == before + 1
