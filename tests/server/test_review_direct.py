"""Review of 4837ae2 (direct answers by the connection guard). Every test here fails on that
commit, except the `direct=False` cases, which show aiohttp's path (direct_infer off) doing
what is expected. Real servers on real ports, raw sockets; each parity test sends the same bytes to a
server with direct_infer on and to one with it off (aiohttp's path), and expects the same."""
import asyncio
import logging
import re
import shutil
import threading

import pytest

from aclserve.acl.cpu import faults
from tests.serving import ServerThread, server_config

from .full_queue import ONE_ROW, WAITING, affine_server, head_of, request
from .hostile import closed_by_server, metric, open_raw, wait_for
from .test_direct_infer import DIRECT, JSON_BODY, binary_body, post, read_answer

INFER = "/v2/models/double/infer"


async def everything(url: str, data: bytes) -> bytes:
    """All the server writes until it closes, or until it has been quiet for a while (a
    connection kept open ends with b"<open>")."""
    reader, writer = await open_raw(url)
    writer.write(data)
    out = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 1.5)
            if not chunk:
                break
            out += chunk
    except asyncio.TimeoutError:
        out += b"<open>"
    writer.close()
    return out


def side_by_side(pair, data: bytes) -> tuple[bytes, bytes]:
    """(everything aiohttp's server wrote, everything the direct one wrote) for `data`, sent to
    both at once: each quiet spell that shows a connection kept open is waited out together."""
    on, off = pair

    async def both():
        return await asyncio.gather(everything(off.url, data), everything(on.url, data))
    return tuple(asyncio.run(both()))


def statuses(raw: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"HTTP/1\.[01] (\d{3}) [A-Z]", raw)]


def raw_post(lines: list[bytes], body: bytes = JSON_BODY, target: bytes = INFER.encode()) -> bytes:
    return b"\r\n".join([b"POST " + target + b" HTTP/1.1", *lines, b"Content-Length: %d" % len(body)]) + \
        b"\r\n\r\n" + body


# -- 1. heads aiohttp's parser refuses are answered directly ---------------------------------------
REFUSED_BY_AIOHTTP = {
    "no Host header": raw_post([]),
    "two Host headers": raw_post([b"Host: a", b"Host: b"]),
    "space in a header name": raw_post([b"Host: t", b"X Foo: bar"]),
    "tab before the colon": raw_post([b"Host: t", b"X-Foo\t: bar"]),
    "line without a colon": raw_post([b"Host: t", b"Garbage"]),
    "control byte in a value": raw_post([b"Host: t", b"X-Foo: a\x01b"]),
    "NUL in a value": raw_post([b"Host: t", b"X-Foo: a\x00b"]),
    "bare CR in a value": raw_post([b"Host: t", b"X-Foo: a\rb"]),
    "obsolete line folding": raw_post([b"Host: t", b"X-Foo: a", b" folded"]),
    "header line over 8190 bytes": raw_post([b"Host: t", b"X-Long: " + b"a" * 9000]),
    "more than 128 headers": raw_post([b"Host: t"] + [b"X-H%d: v" % i for i in range(200)]),
    "non-ASCII byte in the path": raw_post([b"Host: t"], target=b"/v2/models/\xc3\xa9/infer"),
}


@pytest.mark.parametrize("name", list(REFUSED_BY_AIOHTTP))
def test_a_head_aiohttp_refuses_is_not_answered_directly(pair, name):
    """aiohttp answers 400 and closes the connection; the guard's framing (framing.py) checks
    far less than llhttp does, so the direct path runs the request (200, or 404 for the path)."""
    via_aiohttp, direct = side_by_side(pair, REFUSED_BY_AIOHTTP[name])
    assert statuses(via_aiohttp) == [400] and not via_aiohttp.endswith(b"<open>")
    assert statuses(direct) == [400], direct[:300]
    assert not direct.endswith(b"<open>")


def test_a_content_length_aiohttp_refuses_does_not_turn_the_body_into_a_second_request(pair):
    """`Content-Length\\t: N` is not a header to llhttp (400, connection closed), and to the
    framing it is no Content-Length at all (body length 0): the direct path answers the POST,
    then reads its body as a request of its own (smuggled past anything in front that
    framed it by that length)."""
    on, off = pair
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
    data = (b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: t\r\nContent-Length\t: %d\r\n\r\n" % len(smuggled)
            + smuggled)
    assert statuses(asyncio.run(everything(off.url, data))) == [400]
    got = asyncio.run(everything(on.url, data))
    assert statuses(got) == [400], got  # on 4837ae2: [400, 200], the second {"live": true}


# -- 2. Inference-Header-Content-Length read from the lower-cased, latin-1 head -------------------------
def test_an_invalid_inference_header_length_is_quoted_as_sent(pair):
    data = raw_post([b"Host: t", b"Inference-Header-Content-Length: ABC"])
    via_aiohttp, direct = side_by_side(pair, data)
    assert b"got 'ABC'" in via_aiohttp
    assert b"got 'ABC'" in direct, direct  # 4837ae2: got 'abc'


def test_an_inference_header_length_aiohttp_reads_is_read_the_same(pair):
    """aiohttp decodes header values as UTF-8 and int() reads any Unicode digits; the direct
    path decoded the bytes as latin-1: 200 through aiohttp, 400 directly. Both paths now read
    the value the same way (since review 6, ASCII digits only: 400 on both)."""
    body, json_length = binary_body()
    digits = "".join(chr(0x0660 + int(d)) for d in str(json_length)).encode()  # Arabic-Indic
    data = raw_post([b"Host: t", b"Inference-Header-Content-Length: " + digits], body)
    via_aiohttp, direct = side_by_side(pair, data)
    assert statuses(via_aiohttp) == [400]
    assert statuses(direct) == [400]


# -- 3. aiohttp's own flow control undone by the guard's resume_reading ------------------------------
def _send_until_stalled(writer, piece: bytes, limit: int):
    async def send():
        sent = 0
        while sent < limit:
            writer.write(piece)
            try:
                # a hang guard: the server has stopped reading (what it should do) when the
                # kernel's buffers are full; the assertion is on the bytes it took
                await asyncio.wait_for(writer.drain(), 3)
            except asyncio.TimeoutError:
                break
            sent += len(piece)
        return sent
    return send()


FLOOD = 64 << 20
BOUND = 32 << 20  # aiohttp alone takes 3-6 MiB here (its 32 queued requests and the kernel's buffers)


@pytest.mark.parametrize("direct", [False, True])
def test_a_client_that_pipelines_plain_requests_and_reads_no_answer_is_not_read_without_bound(models_dir, tmp_path, direct):
    """direct.py / connections.py: "a client that does not read its answers is not read until
    the transport's buffer drains". Only plain infer requests, pipelined, none of the answers
    read; with direct_infer off the server stops reading after 3-6 MiB. On 4837ae2 it takes
    all 64 MiB: a request whose body a read cut from its head goes to aiohttp (it is forwarded),
    every request behind it too, aiohttp pauses the transport at 32 queued, and `_read_on`
    resumes it behind aiohttp's back; aiohttp, whose flag says paused, never pauses it again
    and keeps each request read in its parser. (A plain flood of such requests hit this on its
    own in 3 runs of 4, wherever a read happened to cut a body from its head; here the cut is
    placed: the first request waits 1 s in its batch window while the cut one arrives.)"""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    (tmp_path / "affine.yaml").write_text("batching: {max_queue_delay_ms: 1000}\n")
    depth = 'model="affine",priority="2",version="1"'
    with ServerThread(server_config(tmp_path, model_control_mode="none", direct_infer=direct)) as s:
        async def scenario():
            _, writer = await open_raw(s.url)
            plain = post(INFER, JSON_BODY)
            cut = plain.index(b"\r\n\r\n") + 10
            writer.write(request(WAITING) + plain[:cut])  # answered directly after 1 s
            await wait_for(lambda: metric(s.url, "aclserve_queue_depth", depth) == 1)
            writer.write(plain[cut:] + plain * 40)  # kept by the guard until that answer
            sent = await _send_until_stalled(writer, plain * 4000, FLOOD)
            writer.transport.abort()
            return sent
        sent = asyncio.run(scenario())
        assert (metric(s.url, DIRECT) >= 1) == direct
        assert sent < BOUND, f"the server took {sent >> 20} MiB of requests from a client that reads nothing"


@pytest.mark.parametrize("direct", [False, True])
def test_after_a_direct_answer_aiohttps_pause_holds(models_dir, tmp_path, direct):
    """The same, deterministically: a direct answer, then (in its stash) one request aiohttp
    runs for a long while (a 60 s batching window) and 40 more behind it: aiohttp pauses
    reading at 32 queued, `_read_on` resumes it, and every byte the client sends after that
    is read and buffered (aiohttp's parser tail, copied whole on each read)."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    (tmp_path / "affine.yaml").write_text(
        "batching: {max_queue_delay_ms: 60000, default_queue_policy: {max_queue_size: 8}}\n")
    depth = 'model="affine",priority="2",version="1"'
    with ServerThread(server_config(tmp_path, model_control_mode="none", shutdown_timeout_s=1,
                                    direct_infer=direct)) as s:
        async def scenario():
            reader, writer = await open_raw(s.url)
            slow = head_of(WAITING).replace(b"\r\n\r\n", b"\r\nAccept-Encoding: identity\r\n\r\n") + WAITING
            live = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
            writer.write(post(INFER, JSON_BODY) + slow + live * 40)
            assert (await read_answer(reader))[0] == 200
            await wait_for(lambda: metric(s.url, "aclserve_queue_depth", depth) == 1)
            padded = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Pad: %s\r\n\r\n" % (b"a" * 4000)
            sent = await _send_until_stalled(writer, padded * 256, FLOOD)
            writer.transport.abort()
            return sent
        sent = asyncio.run(scenario())
        assert metric(s.url, DIRECT) == (1 if direct else 0)
        assert sent < BOUND, f"the server took {sent >> 20} MiB while aiohttp had 32 requests queued"


# -- 4. shutdown: a request pipelined behind a direct one -----------------------------------------------
@pytest.mark.parametrize("direct", [False, True])
def test_a_request_pipelined_behind_one_in_flight_at_shutdown_is_answered(models_dir, tmp_path, make_config, direct,
                                                                            clean_faults):
    """The direct path closed the connection after the first answer, which said nothing of it
    (no Connection: close): the client could not tell whether its second POST ran. Both paths
    now say `Connection: close` on an answer made during the drain (tracking_middleware, and the
    direct path as aiohttp's), and the pipelined request is not read: the client knows it did not
    run. The first request's execution is held until the shutdown has begun (a batching window
    that ended before it let both be answered 200 on a slow machine)."""
    s = affine_server(models_dir, tmp_path, make_config, window_ms=0, queue_size=4, direct_infer=direct,
                      execution_timeout_ms=600_000)  # only the gate ends the held execution
    s.__enter__()
    gate = threading.Event()

    async def scenario():
        idle_reader, idle = await open_raw(s.url)  # closed by the server once its shutdown begins
        held = faults.inject("execute", nth=1, hold=gate)
        reader, writer = await open_raw(s.url)
        writer.write(request(WAITING) + request(ONE_ROW))
        await wait_for(held.entered.is_set)
        stopping = asyncio.get_running_loop().run_in_executor(None, s.close)
        await closed_by_server(idle_reader)
        gate.set()  # the first request is answered within the drain
        out = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 30):
            out += chunk
        await stopping
        for w in (writer, idle):
            w.close()
        return out
    try:
        out = asyncio.run(scenario())
    finally:
        gate.set()
        s.close()
    assert statuses(out) == [200], out
    assert b"\r\nConnection: close" in out.split(b"\r\n\r\n")[0], out


# -- 5. the access log at log_level: debug --------------------------------------------------------------
@pytest.mark.parametrize("direct", [False, True])
def test_debug_access_log_lists_infer_requests(models_dir, direct):
    """log_level: debug turns on aiohttp's access log (server/app.py make_runner); the README
    names only the guard's early 503s as missing from it."""
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    handler = Keep()
    logger = logging.getLogger("aiohttp.access")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with ServerThread(server_config(models_dir, model_control_mode="none", log_level="debug",
                                        direct_infer=direct)) as s:
            async def both():  # (side by side: their quiet spells are waited out together)
                return await asyncio.gather(everything(s.url, post(INFER, JSON_BODY)),
                                            everything(s.url, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"))
            status, _ = asyncio.run(both())
            assert statuses(status) == [200]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert any("/v2/health/live" in line for line in lines)
    assert any(INFER in line for line in lines), lines
