"""`aclserve infer` against what is not a healthy KServe v2 server (one that never answers,
another protocol on the port, a wrong answer, a redirect): one line each, no traceback, and no
wait past --timeout."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.canned_server import canned_server, recording_server, redirect_to, web_server
from tests.infer_command import infer_at


# what each fake server answers once it has read a request's head (None: nothing, ever)
ANSWERS = {
    "silent": None,
    "grpc port": b"\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage\r\n\r\n",
    "html": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\n<html/>\r\n",
    "bad header length": b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: abc\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}",
    "outputs not a list": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"outputs\": \"y\"}"[:-1],
    # (taken for an answer of no outputs: nothing printed, exit 0)
    "no outputs": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    # an empty list of outputs, and a header length past the body: nothing printed, exit 0 (a tester, t86)
    "empty outputs": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"outputs\": []}",
    "header past the body": b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 99999\r\nContent-Length: 15\r\n"
                            b"Connection: close\r\n\r\n{\"outputs\": []}",
    # JSON nested past Python's stack: a RecursionError traceback (a tester's find)
    "nested deeply": b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n"
                     + b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("case", list(ANSWERS))
def test_infer_against_what_is_not_a_kserve_server_is_one_line(tmp_path, case):
    """A gRPC port was http.client's BadStatusLine traceback, HTML a JSONDecodeError, a server that
    never answered held the command 330 s (30 s of metadata, then 300 s)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    # (a short --timeout for the server that never answers; the others' answers must not meet it on a
    # loaded machine: the 200 KB one missed 0.5 s once, "no answer from")
    timeout = "0.5" if case == "silent" else "30"
    with canned_server(ANSWERS[case]) as url:
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url", url,
                               "--timeout", timeout], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr[:-1].isprintable()  # one printable line
    expected = "no answer from" if case == "silent" else "did not answer as a KServe v2 HTTP server"
    assert expected in proc.stderr, proc.stderr
    if case == "grpc port":  # (its frames were printed as "??????ÿÿ????@?þ")
        assert proc.stderr.endswith(": binary data, not HTTP/1.1 text (an HTTP/2 or gRPC port?)\n"), proc.stderr


def test_a_model_name_of_bytes_that_are_not_utf8_is_sent_for_the_server_to_judge(tmp_path):
    """It was a UnicodeEncodeError traceback (quoting a str holding surrogate escapes)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with canned_server(ANSWERS["html"]) as url:
        proc = subprocess.run([sys.executable.encode(), b"-m", b"aclserve", b"infer", b"m\xff", b"-i", b"x=x.npy",
                               b"--url", url.encode(), b"--timeout", b"5"], cwd=tmp_path, capture_output=True,
                              timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"did not answer as a KServe v2 HTTP server" in proc.stderr, proc.stderr


def test_a_line_with_tabs_or_colours_is_text_not_binary():
    """(the review of the binary rule: tabs and ESC counted as binary bytes)"""
    from aclserve.cli.usage import one_line
    assert one_line("error:\tbad value\tx") == "error: bad value x"
    assert one_line("\x1b[31mred\x1b[0m") == "?[31mred?[0m"
    assert one_line("\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage").startswith("binary data")


@pytest.mark.parametrize("scheme, said", [
    ("http", "(a TLS port? try https://)"),  # the server closes without a word: a TLS port's way
    ("http-reset", "(a TLS port? try https://)"),  # ... or resets, closing with bytes unread (a CI run met it)
    ("https", "(not a TLS port? try http://)"),  # a plain HTTP answer to the TLS hello
])
def test_a_url_of_the_wrong_scheme_gets_a_hint(tmp_path, scheme, said):
    """Plain HTTP to the TLS port ended in "Remote end closed connection without response" (or a
    reset), TLS to a plain port in "[SSL: WRONG_VERSION_NUMBER]", neither saying what to change."""
    import contextlib
    import socket
    import struct
    import threading
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    if scheme == "http-reset":  # closed with an RST, as with bytes unread
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    if scheme == "https":
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"{scheme.split('-')[0]}://127.0.0.1:{listener.getsockname()[1]}"
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url", url,
                               "--timeout", "5"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        listener.close()
    assert proc.returncode == 1 and proc.stderr.rstrip("\n").endswith(said), proc.stderr


def test_a_web_server_that_is_not_kserve_is_said_so(tmp_path):
    """`python -m http.server` answers the metadata GET 404 (the infer POST 501) with an HTML page:
    "HTTP 501: <!DOCTYPE HTML>" said nothing of what was wrong (a new user's report)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with web_server(tmp_path) as url:
        proc = infer_at(url, "m", "-i", "x=x.npy", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{url} did not answer as a KServe v2 HTTP server: HTTP 404: <!DOCTYPE HTML>" in proc.stderr, proc.stderr


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(tmp_path):
    """urllib followed a 302 to another server and sent it the ACLSERVE_API_TOKEN header (a
    security tester's find): the redirect is reported instead, and nothing reaches its target."""
    import os

    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with recording_server() as (target, seen):
        elsewhere = f"{target}/v2/models/m"
        with canned_server(redirect_to(elsewhere)) as url:
            proc = infer_at(url, "m", "-i", "x=x.npy", cwd=tmp_path, env=dict(os.environ, ACLSERVE_API_TOKEN="s3cret"))
    assert seen == []
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{url} redirects (HTTP 302) to {elsewhere}: not followed" in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout
