"""Connections are bounded and timed: slowloris heads and idle floods are closed by their
timeouts while other clients are served, a full server makes room or refuses cleanly, and a
stalled client does not hold shutdown. Loopback only, bounded counts; the limits in the loops
are hang guards, not timing checks."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import aiohttp
import pytest

from aclserve.server.connections import EVICT_AFTER_S

from tests import REPO
from tests.serving import ServerThread

from .hostile import closed_by_server, metric, open_raw, read_response, wait_for

GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
HTTP = 'transport="http"'  # aclserve_connections' label of the connections counted here
HEAD = b"POST /v2/models/double/infer HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n"


async def good_request(url: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{url}/v2/models/double/infer", data=GOOD) as resp:
            await resp.read()
            return resp.status


@pytest.fixture(scope="module")
def timed(models_dir, make_config):
    with ServerThread(make_config(models_dir, header_timeout_s=0.5, keepalive_timeout_s=1.5)) as srv:
        yield srv


def test_slowloris_heads_are_closed_while_others_are_served(timed):
    async def slow_client():
        reader, writer = await open_raw(timed.url)
        trickle = asyncio.ensure_future(_trickle(writer))
        closed = await closed_by_server(reader)
        trickle.cancel()
        writer.close()
        return closed

    async def scenario():
        slow = [asyncio.ensure_future(slow_client()) for _ in range(50)]
        served = [await good_request(timed.url) for _ in range(5)]
        return await asyncio.gather(*slow), served
    closed, served = asyncio.run(scenario())
    assert all(closed) and served == [200] * 5
    assert metric(timed.url, "aclserve_connections_closed_total", 'reason="header_timeout"') >= 50


async def _trickle(writer):
    for i in range(len(HEAD)):  # one byte every 0.1 s: the head never completes in time
        writer.write(HEAD[i:i + 1])
        await asyncio.sleep(0.1)


def test_idle_connections_are_closed_while_others_are_served(timed):
    async def idle_client():
        reader, writer = await open_raw(timed.url)
        closed = await closed_by_server(reader)
        writer.close()
        return closed

    async def scenario():
        idle = [asyncio.ensure_future(idle_client()) for _ in range(100)]
        served = [await good_request(timed.url) for _ in range(5)]
        return await asyncio.gather(*idle), served
    closed, served = asyncio.run(scenario())
    assert all(closed) and served == [200] * 5
    asyncio.run(wait_for(lambda: metric(timed.url, "aclserve_connections", HTTP) <= 1))  # 1: the scrape itself


def test_a_full_server_replaces_its_longest_idle_connection_or_refuses(models_dir, make_config):
    srv = ServerThread(make_config(models_dir, max_connections=11, keepalive_timeout_s=60)).start()
    try:
        async def scenario():
            busy = [await open_raw(srv.url) for _ in range(10)]
            for _, writer in busy:  # each in a request (its body but a byte sent): never given up for another
                writer.write(HEAD + b"\r\n{" + b" " * 8)
            await wait_for(lambda: metric(srv.url, "aclserve_request_memory_bytes") >= 10 * 10)
            fresh = await open_raw(srv.url)  # the 11th: in, idle for far less than a second
            reader, writer = await open_raw(srv.url)  # the 12th: nobody to make room (over the cap: a probe alone)
            writer.write(b"GET /v2/models/double HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            refused = await read_response(reader)
            writer.close()
            for _, w in busy + [fresh]:
                w.close()
            await wait_for(lambda: open_connections(srv.url) <= 1)  # the server saw them go (1: the scrape)
            idle = [await open_raw(srv.url) for _ in range(11)]  # full again, every one idle
            await until_the_server_holds(11, *idle[-1])
            # each has been idle since before that count came (the last since its answer): from
            # here they have certainly been idle long enough to give way, however slow the machine
            await asyncio.sleep(EVICT_AFTER_S)
            served = await good_request(srv.url)
            for _, w in idle:
                w.close()
            return refused, served
        (status, answer), served = asyncio.run(scenario())
        assert status == 503 and b"max_connections" in answer and b"Retry-After" in answer
        assert served == 200
        assert metric(srv.url, "aclserve_connections_closed_total", 'reason="evicted"') >= 1
        assert metric(srv.url, "aclserve_connections_closed_total", 'reason="refused"') >= 1
    finally:
        srv.close()


async def until_the_server_holds(count: int, reader, writer) -> None:
    """Ask /metrics on this kept-alive connection (one of those counted, so that a full server
    answers it) until aclserve_connections is `count`; the limit is a hang guard."""
    for _ in range(1500):
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
        body = (await asyncio.wait_for(reader.readexactly(length), 30)).decode()
        if re.search(r'(?m)^aclserve_connections\{transport="http"\} (\S+)$', body).group(1) == f"{count:.1f}":
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"the server never held {count} connections")


def open_connections(url: str) -> float:
    try:
        return metric(url, "aclserve_connections", HTTP)
    except OSError:  # refused: still full
        return float("inf")


def test_shutdown_does_not_wait_for_a_stalled_upload(models_dir, make_config):
    """The upload stalls mid-body (it would wait 60 s for body_timeout_s): shutdown gives it
    shutdown_timeout_s, then answers it 503 "shutting down" (it was closed with no answer, found
    by an independent check) and closes it; idle connections are closed once their grace ends (idle_grace.py)."""
    srv = ServerThread(make_config(models_dir, shutdown_timeout_s=0.5, body_timeout_s=60)).start()

    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(HEAD + b"\r\n" + b"{" + b" " * 8)  # its body but a byte (charged as it comes)
        idle_reader, idle_writer = await open_raw(srv.url)
        await wait_for(lambda: metric(srv.url, "aclserve_request_memory_bytes") >= 10)
        await asyncio.get_running_loop().run_in_executor(None, srv.close)  # blocks until stopped
        answer = await read_response(reader, limit_s=5)
        stalled = await closed_by_server(reader, limit_s=5)
        idle = await closed_by_server(idle_reader, limit_s=5)
        writer.close()
        idle_writer.close()
        return answer, stalled, idle
    (status, answer), stalled, idle = asyncio.run(scenario())
    assert status == 503 and b"server is shutting down" in answer and b"Retry-After" in answer, answer
    assert stalled and idle
    assert srv.error is None and not srv._thread.is_alive()


@pytest.mark.parametrize("direct", [True, False], ids=["answered by the guard", "answered by aiohttp"])
def test_a_client_that_reads_its_answers_late_gets_every_one(make_config, tmp_path, direct):
    """Pipelined requests whose client reads nothing for longer than keepalive_timeout_s: the
    connection, waiting on its client with answers unread and requests queued behind them, was
    closed as idle and the answers already counted were lost (found by an independent check).
    Now such a connection waits up to body_timeout_s."""
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "digits.om")
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [32, 64], "data": [0.5] * 2048}]})
    request = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    count = 2000  # answers of about 4 KB: far more than the socket buffers hold
    config = make_config(tmp_path, keepalive_timeout_s=1.0, header_timeout_s=1.0, direct_infer=direct,
                         model_control_mode="none")
    with ServerThread(config) as server:
        host, port = server.url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.settimeout(60)  # a hang guard
            threading.Thread(target=_send_all, args=(sock, request * count), daemon=True).start()
            time.sleep(3.0)  # not reading: the server's writes stall, past keepalive_timeout_s
            answers, received = 0, b""
            while answers < count:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                received += chunk
                answers = received.count(b"HTTP/1.1 200 OK")
    assert answers == count


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the connection reset: the assertion says so
        sock.sendall(data)


def test_a_low_descriptor_limit_is_shared_between_http_and_grpc():
    """Under a hard limit that fits neither max_connections, HTTP and gRPC share what fits in
    proportion (HTTP took it all before, leaving gRPC one connection). In a subprocess: a hard
    limit cannot be raised again."""
    code = textwrap.dedent("""
        import logging, resource
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        from aclserve.server.descriptors import fit_connection_caps
        print(fit_connection_caps(4096, 4096), fit_connection_caps(4096, 0), fit_connection_caps(100, 100))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        print(fit_connection_caps(4096, 4096), fit_connection_caps(100, 0))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # 1024: 512 kept for the server's own files, 128 for refusals lingering; 256: 128 and 32 (a
    # fixed reserve of 512 and 256 left one connection under a limit of 768 or less)
    assert proc.stdout.split() == ["(192,", "192)", "(384,", "0)", "(100,", "100)",
                                   "(48,", "48)", "(96,", "0)"], proc.stdout
    assert "connections capped at 192 for HTTP and 192 for gRPC (max_connections 4096)" in proc.stderr
