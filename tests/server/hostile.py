"""Raw-socket and metrics helpers for the hostile-client tests (bounded counts, loopback only)."""
from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import urllib.request

import pytest


@contextlib.contextmanager
def lingering(seconds: float):
    """In-process servers started inside read the unread rest of a refused (or timed-out) body
    for `seconds`, not app.BODY_LINGER_S (10 s), before they close its connection (aiohttp's
    lingering_time): for a test that waits for that close and sends no rest that needs reading."""
    from aclserve.server import app
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app, "BODY_LINGER_S", seconds)
        yield


def metric(url: str, name: str, labels: str = "", token: str | None = None) -> float:
    """The value of one sample of /metrics (0 when absent); `token`: the server's API token, which
    its /metrics needs with auth_inference."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = urllib.request.urlopen(urllib.request.Request(f"http://{url}/metrics", headers=headers),
                                  timeout=30).read().decode()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else r"(?:\{\})?") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def wait_for(predicate, limit_s: float = 30.0, step_s: float = 0.02):
    """Poll until predicate() is truthy; the limit is a hang guard, not a timing check."""
    async def loop():
        while True:
            value = predicate()
            if value:
                return value
            await asyncio.sleep(step_s)
    return await asyncio.wait_for(loop(), limit_s)


async def open_raw(url: str):
    host, port = url.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def head(path: str, headers: dict) -> bytes:
    # (a loopback name: a control route of a server without a token refuses others, as a web page's)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def stalled_upload(url: str, length: int, sent: int | None = None, path: str = "/v2/models/double/infer",
                         headers: dict | None = None):
    """(reader, writer) of an upload declaring `length` bytes that stops after `sent` (all but
    its last byte), once the server holds what it sent: a body is charged as its bytes come."""
    sent = length - 1 if sent is None else sent
    before = metric(url, "aclserve_request_memory_bytes")
    reader, writer = await open_raw(url)
    writer.write(head(path, {**(headers or {}), "Content-Length": length}) + b"{" + b" " * (sent - 1))
    await wait_for(lambda: metric(url, "aclserve_request_memory_bytes") >= before + sent)
    return reader, writer


async def read_response(reader, limit_s: float = 30.0) -> tuple[int, bytes]:
    """(status, whole answer) of the next response; (0, b"") when the server closed first."""
    data = await asyncio.wait_for(reader.read(65536), limit_s)
    if not data:
        return 0, b""
    return int(data.split(b" ", 2)[1]), data


async def closed_by_server(reader, limit_s: float = 30.0) -> bool:
    """Read until EOF (or a reset); True when that happens within the hang guard."""
    async def drain():
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
    await asyncio.wait_for(drain(), limit_s)
    return True


def read_answer_head(sock: socket.socket) -> tuple[bytes, list[bytes], bytes, int]:
    """From a blocking socket: an HTTP answer's (status line, header lines lowercased, what of its
    body came with the head, its Content-Length)."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    head, rest = got.split(b"\r\n\r\n", 1)
    status, *headers = head.split(b"\r\n")
    headers = [line.lower() for line in headers]
    length = next(int(line.split(b":")[1]) for line in headers if line.startswith(b"content-length:"))
    return status, headers, rest, length
