"""Regressions found in review of 288a247..HEAD (overload holds, Expect: 100-continue).

Each test fails on the reviewed code and states the behaviour the change's own docs promise."""
import asyncio
import json

import pytest

from aclserve.server.connections import BODY_LINGER_S
from tests.serving import ServerThread

from .hostile import closed_by_server, head, lingering, metric, open_raw, read_response, stalled_upload

MiB = 1 << 20
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def post(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/double/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.fixture
def srv(models_dir, make_config, request):
    values = dict(max_body_bytes=4 * MiB, max_request_bytes=3 * MiB + MiB // 2, max_inflight_bytes=4 * MiB,
                  max_json_bytes=4 * MiB)  # a body all JSON is not refused from its length first
    values.update(request.param)
    # lingering_s (no config key: hostile.lingering) for a test that waits for a refused body's close
    with lingering(values.pop("lingering_s", BODY_LINGER_S)), ServerThread(make_config(models_dir, **values)) as s:
        yield s


async def still_open(reader, seconds: float) -> bool:
    try:
        await closed_by_server(reader, seconds)
        return False
    except asyncio.TimeoutError:
        return True


async def answer_then_alive(url: str, raw: bytes):
    """(status, answer, whether the connection is still open past the header timeout) for the
    request `raw`."""
    reader, writer = await open_raw(url)
    writer.write(raw)
    status, answer = await read_response(reader)
    alive = await still_open_past_the_header_timeout(url, reader)
    writer.close()
    return status, answer, alive


async def still_open_past_the_header_timeout(url: str, reader) -> bool:
    """Whether `reader`'s connection is still open once the header timeout has closed a witness,
    a connection opened after it that sends half a head. The sweep closes every head past its
    timeout, oldest first: by the witness's close it has passed this connection's deadline, were
    it taken for a head, and a close of that sweep reaches this socket before the witness's
    (0.5 s for the client's loop to read it)."""
    witness_reader, witness = await open_raw(url)
    witness.write(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n")  # a head that never ends
    await closed_by_server(witness_reader)
    witness.close()
    return await still_open(reader, 0.5)


@pytest.mark.parametrize("srv", [dict(header_timeout_s=0.5, keepalive_timeout_s=15)], indirect=True)
def test_a_417_answered_connection_is_idle_not_a_head(srv):
    """expect_body's 417 is returned by aiohttp before the middlewares, so tracking_middleware
    never moves the connection out of HEAD: the kept-alive connection is closed by the header
    timeout (counted as header_timeout) instead of living keepalive_timeout_s."""
    status, answer, alive = asyncio.run(answer_then_alive(srv.url, post(GOOD, b"Expect: something-else\r\n")))
    assert status == 417 and b"Connection: close" not in answer  # kept alive by the server
    assert alive, "closed after header_timeout_s although the request was answered"
    assert metric(srv.url, "aclserve_connections_closed_total", 'reason="header_timeout"') == 1  # the witness


@pytest.mark.parametrize("srv", [dict(keepalive_timeout_s=0.5, body_timeout_s=5.0, hold_refused_connections=True)],
                         indirect=True)
def test_no_hold_when_the_keepalive_timeout_leaves_no_whole_second(srv):
    """A hold must end before the idle sweep would close the held connection; with
    keepalive_timeout_s 0.5 no hold fits, so the refused connection is read again at once."""
    async def scenario():
        _, stall = await stalled_upload(srv.url, 3 * MiB)
        reader, writer = await open_raw(srv.url)
        writer.write(post(b"{" + b" " * MiB + b"}"))
        status, answer = await read_response(reader)
        writer.write(post(GOOD))  # at once: answered at once, not after a hold
        next_status, _ = await read_response(reader)
        stall.close()
        writer.close()
        return status, answer, next_status
    status, answer, next_status = asyncio.run(scenario())
    assert status == 503 and b"\r\nRetry-After: 1\r\n" in answer
    assert next_status == 200
    assert metric(srv.url, "aclserve_connection_holds_total") == 0


@pytest.mark.parametrize("srv", [dict(api_token="review-token-0123456789", auth_inference=True)], indirect=True)
def test_expect_is_answered_401_before_any_size_or_budget_check(srv):
    """expect_body runs before the middlewares (access_middleware included): a client without
    the token is told 413 (or 503 with the budget's figures, and held) instead of 401."""
    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": 100 * MiB, "Expect": "100-continue"}))
        status, answer = await read_response(reader)
        writer.close()
        return status, answer
    status, answer = asyncio.run(scenario())
    assert status == 401, answer


@pytest.mark.parametrize("srv", [dict(header_timeout_s=0.5, keepalive_timeout_s=15)], indirect=True)
def test_unknown_expectation_on_another_route_is_a_json_417_and_the_connection_idle(srv):
    """Every route has the same Expect handling (server/expect.py): aiohttp's default answered a
    plain-text 417 outside the middlewares, and the tracker then kept the kept-alive connection
    in its head phase until header_timeout_s closed it."""
    raw = head("/v2/repository/index", {"Content-Length": 2, "Expect": "something-else"}) + b"{}"
    status, answer, alive = asyncio.run(answer_then_alive(srv.url, raw))
    assert status == 417, answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "unknown expectation: Expect: something-else"}
    assert alive, "closed after header_timeout_s although the request was answered"
    assert metric(srv.url, "aclserve_connections_closed_total", 'reason="header_timeout"') == 1  # the witness


@pytest.mark.parametrize("srv", [dict(header_timeout_s=0.5, keepalive_timeout_s=15)], indirect=True)
@pytest.mark.parametrize("method,path", [("GET", "/nope"), ("PUT", "/v2/health/live")])
@pytest.mark.parametrize("expect", [b"something-else", b"\xff"])
def test_unknown_expectation_where_no_route_matches_is_a_json_417(srv, method, path, expect):
    """A request no route takes (404, 405) had aiohttp's own expect handler: a plain-text 417
    outside the middlewares (the tracker kept the connection in its head phase), and for a byte
    that is not UTF-8 a plain-text 500 with an ERROR traceback (aiohttp's 417 cannot encode
    the lone surrogate it decoded the byte to)."""
    raw = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n".encode() + b"Expect: " + expect + b"\r\n\r\n{}"
    status, answer, alive = asyncio.run(answer_then_alive(srv.url, raw))
    assert status == 417, answer
    shown = expect.decode("utf-8", "surrogateescape").encode("utf-8", "backslashreplace").decode()
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": f"unknown expectation: Expect: {shown}"}
    assert alive, "closed after header_timeout_s although the request was answered"


@pytest.mark.parametrize("srv", [dict()], indirect=True)
def test_100_continue_on_another_route_then_its_answer(srv):
    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(head("/v2/repository/index", {"Content-Length": 2, "Expect": "100-continue"}))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        writer.write(b"{}")
        status, answer = await read_response(reader)
        writer.close()
        return interim, status, answer
    interim, status, answer = asyncio.run(scenario())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status == 200 and "double" in {m["name"] for m in json.loads(answer.split(b"\r\n\r\n", 1)[1])}


@pytest.mark.parametrize("srv", [dict(lingering_s=1.0)], indirect=True)  # (its close came 10 s after the 413)
@pytest.mark.parametrize("path, limit", [("/v2/repository/index", "the repository API's limit"),
                                         ("/v2/trace/setting", "the trace setting API's limit")])
def test_a_control_body_declared_over_its_limit_is_refused_before_100_continue(srv, path, limit):
    """The control routes answered 100 Continue to any declared length, then refused the body
    they had asked for, unread, with a 413 (found by a fuzz of every route)."""
    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(head(path, {"Content-Length": 2 * MiB, "Expect": "100-continue"}))
        status, answer = await read_response(reader)
        closed = await reader.read(1) == b""
        writer.close()
        return status, answer, closed
    status, answer, closed = asyncio.run(scenario())
    assert status == 413 and limit.encode() in answer, answer
    assert closed  # a body sent anyway is not read


@pytest.mark.parametrize("srv", [dict(api_token="review-token-0123456789")], indirect=True)
@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/double/unload", "/v2/trace/setting"])
def test_a_control_route_asks_for_its_token_before_100_continue(srv, path):
    """The control routes told a client without the token to send its body, then answered 401
    (found by a review); the infer route checked the token first already."""
    async def scenario():
        reader, writer = await open_raw(srv.url)
        writer.write(head(path, {"Content-Length": 2, "Expect": "100-continue"}))
        status, answer = await read_response(reader)
        writer.close()
        return status, answer
    status, answer = asyncio.run(scenario())
    assert status == 401 and b"API token" in answer, answer
