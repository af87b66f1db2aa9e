"""Plain infer requests answered by the connection guard itself (server/direct.py): the same
answers as aiohttp's path, in order, cancelled with their client, and everything that is not
plain still through aiohttp. Real server, raw sockets (a request with Accept-Encoding goes
through aiohttp: the same request both ways, side by side)."""
import asyncio
import json

import numpy as np
import pytest
from aiohttp import web

from aclserve.repository import ModelRepository
from aclserve.runtime import AclRuntime
from aclserve.server.app import create_app, direct_answers
from tests.serving import ServerThread

from .full_queue import WAITING, affine_server, head_of
from .hostile import metric, open_raw, wait_for

DIRECT = "aclserve_direct_infer_total"
X = [float(i) for i in range(16)]
JSON_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": X}]}).encode()


def binary_body() -> tuple[bytes, int]:
    raw = np.array(X, dtype="<f4").tobytes()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    return header + raw, len(header)


def post(path: str, body: bytes, extra: dict | None = None) -> bytes:
    # (a loopback Host: a control route of a server without a token refuses others, as a web page's)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"
VIA_AIOHTTP = {"Accept-Encoding": "identity"}  # aiohttp may compress: such requests go its way


async def read_answer(reader) -> tuple[int, dict, bytes]:
    """(status, headers with lower-case names, body) of the next answer (Content-Length framed)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 30)
    return int(lines[0].split(" ", 2)[1]), headers, body


async def exchange(url: str, data: bytes, answers: int = 1) -> list[tuple[int, dict, bytes]]:
    reader, writer = await open_raw(url)
    writer.write(data)
    got = [await read_answer(reader) for _ in range(answers)]
    writer.close()
    return got


@pytest.fixture(scope="module")
def srv(models_dir):
    from tests.serving import server_config
    with ServerThread(server_config(models_dir, model_control_mode="none")) as s:
        yield s


def both_ways(url: str, data_direct: bytes, data_aiohttp: bytes):
    before = metric(url, DIRECT)
    direct = asyncio.run(exchange(url, data_direct))[0]
    assert metric(url, DIRECT) == before + 1
    via = asyncio.run(exchange(url, data_aiohttp))[0]
    assert metric(url, DIRECT) == before + 1  # that one went through aiohttp
    return direct, via


def same_answer(direct, via):
    (status, headers, body), (status2, headers2, body2) = direct, via
    assert status == status2
    assert body == body2
    assert set(headers) == set(headers2), (headers, headers2)
    for name in headers:
        if name != "date":
            assert headers[name] == headers2[name], name


def test_json_and_binary_answers_are_aiohttp_s(srv):
    path = "/v2/models/double/infer"
    direct, via = both_ways(srv.url, post(path, JSON_BODY), post(path, JSON_BODY, VIA_AIOHTTP))
    same_answer(direct, via)
    assert direct[0] == 200 and json.loads(direct[2])["outputs"][0]["data"] == [2 * v for v in X]
    assert direct[1]["vary"] == "Accept-Encoding"  # (aiohttp's path would compress it, asked: infer.py)
    body, json_length = binary_body()
    extra = {"Inference-Header-Content-Length": json_length}
    direct, via = both_ways(srv.url, post(path, body, extra), post(path, body, dict(extra, **VIA_AIOHTTP)))
    same_answer(direct, via)
    assert direct[1]["content-type"] == "application/octet-stream"
    header_length = int(direct[1]["inference-header-content-length"])
    assert np.frombuffer(direct[2][header_length:], "<f4").tolist() == [2 * v for v in X]
    direct, via = both_ways(srv.url, post("/v2/models/double/versions/1/infer", JSON_BODY),
                            post("/v2/models/double/versions/1/infer", JSON_BODY, VIA_AIOHTTP))
    same_answer(direct, via)


def test_an_inference_header_content_length_given_twice_is_refused_both_ways(srv):
    """Two values could frame the body two ways (aiohttp's headers.get took the first)."""
    path = "/v2/models/double/infer"
    body, json_length = binary_body()
    line = b"Inference-Header-Content-Length: %d\r\n" % json_length
    for second in (json_length, 0):
        twice = {"Inference-Header-Content-Length": json_length}
        direct_data, via_data = (post(path, body, extra).replace(line, line + line.replace(b"%d" % json_length,
                                                                                             b"%d" % second))
                                 for extra in (twice, dict(twice, **VIA_AIOHTTP)))
        direct, via = both_ways(srv.url, direct_data, via_data)
        same_answer(direct, via)
        assert direct[0] == 400 and json.loads(direct[2])["error"] == (
            "Inference-Header-Content-Length is given 2 times; send it once")


@pytest.mark.parametrize("path,body", [
    ("/v2/models/ghost/infer", JSON_BODY),  # 404
    ("/v2/models/double/versions/7/infer", JSON_BODY),  # 404: no such version
    ("/v2/models/double/infer", b"{not json"),  # 400
    ("/v2/models/double/infer", JSON_BODY.replace(b"[1, 16]", b"[1, 15]")),  # 400: shape
    ("/v2/models/double/infer", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1e400]}]}'),
    ("/v2/models/double/infer", JSON_BODY.replace(b"[1, 16]", b"[1, %s]" % (b"9" * 400))),  # was a 500
])
def test_errors_are_aiohttp_s(srv, path, body):
    direct, via = both_ways(srv.url, post(path, body), post(path, body, VIA_AIOHTTP))
    same_answer(direct, via)
    assert direct[0] in (400, 404) and "error" in json.loads(direct[2])


def test_pipelined_requests_are_answered_in_order(srv):
    """Direct answers, an aiohttp route and an aiohttp-bound infer request, all in one write."""
    other = JSON_BODY.replace(b"0.0, ", b"5.0, ", 1)
    path = "/v2/models/double/infer"
    data = (post(path, JSON_BODY) + GET_LIVE + post(path, other) + post(path, b"{}")
            + post(path, JSON_BODY, VIA_AIOHTTP) + post(path, other))
    got = asyncio.run(exchange(srv.url, data, 6))
    assert [status for status, _, _ in got] == [200, 200, 200, 400, 200, 200]
    assert json.loads(got[1][2]) == {"live": True}
    first = json.loads(got[0][2])["outputs"][0]["data"]
    second = json.loads(got[2][2])["outputs"][0]["data"]
    assert first[0] == 0.0 and second[0] == 10.0
    assert json.loads(got[4][2])["outputs"][0]["data"] == first
    assert json.loads(got[5][2])["outputs"][0]["data"] == second


def test_a_body_that_did_not_come_with_its_head_goes_through_aiohttp(srv):
    async def scenario():
        data = post("/v2/models/double/infer", JSON_BODY)
        cut = data.index(b"\r\n\r\n") + 4
        reader, writer = await open_raw(srv.url)
        writer.write(data[:cut])
        # the guard framed the head alone and aiohttp's handler waits for the body (a pause of the
        # test's, 0.2 s, left it to the server to read the head before the body came, which a
        # loaded machine may not do: the two read at once are a plain request, answered directly;
        # nothing is charged for a body not yet come: the handler is seen by its request in flight)
        await wait_for(lambda: metric(srv.url, "aclserve_requests_in_flight") > 0)
        writer.write(data[cut:])
        answer = await read_answer(reader)
        writer.close()
        return answer
    before = metric(srv.url, DIRECT)
    status, _, body = asyncio.run(scenario())
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2 * v for v in X]
    assert metric(srv.url, DIRECT) == before


@pytest.mark.parametrize("extra", [{"Expect": "100-continue"}, {"Content-Encoding": "identity"},
                                   {"Accept-Encoding": "gzip"}])
def test_requests_that_are_not_plain_go_through_aiohttp(srv, extra):
    before = metric(srv.url, DIRECT)
    data = post("/v2/models/double/infer", JSON_BODY, extra)
    if "Expect" in extra:
        cut = data.index(b"\r\n\r\n") + 4
        async def scenario():
            reader, writer = await open_raw(srv.url)
            writer.write(data[:cut])
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(data[cut:])
            answer = await read_answer(reader)
            writer.close()
            return answer
        status = asyncio.run(scenario())[0]
    else:
        status = asyncio.run(exchange(srv.url, data))[0][0]
    assert status == 200
    assert metric(srv.url, DIRECT) == before


def test_traced_and_logged_requests_are_answered_here_and_observed(models_dir, tmp_path, caplog):
    """Tracing (at any rate) and the request log sent every request through aiohttp: tracing
    one in a thousand cost 1.8 times the server's CPU a request (found by a helper). They are
    answered here now, and observed as on aiohttp's path: the log line and the trace name the
    request by its X-Request-Id, as sent."""
    import logging
    import time
    from tests.serving import server_config
    setting = "/v2/trace/setting"
    config = server_config(models_dir, model_control_mode="none", trace_dir=str(tmp_path), request_log=True)
    with ServerThread(config) as s:
        caplog.set_level(logging.INFO, logger="aclserve.requests")

        def send(request_id: str):
            data = post("/v2/models/double/infer", JSON_BODY, {"X-Request-Id": request_id})
            status, _, body = asyncio.run(exchange(s.url, data))[0]
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2 * v for v in X]

        def trace(level: str):
            change = json.dumps({"trace_level": [level], "trace_rate": "1", "trace_file": "t.json",
                                 "trace_format": "triton"}).encode()
            request = post(setting, change, {"Content-Type": "application/json", "Accept-Encoding": "identity"})
            assert asyncio.run(exchange(s.url, request))[0][0] == 200

        before = metric(s.url, DIRECT)
        send("Logged-1")
        trace("TIMESTAMPS")
        send("Traced-2")
        trace("OFF")
        assert metric(s.url, DIRECT) == before + 2  # both answered here
        lines = [r.fields for r in caplog.records if r.name == "aclserve.requests"]
        assert [(line["request_id"], line["status"]) for line in lines[-2:]] == [("Logged-1", 200), ("Traced-2", 200)]
        assert lines[-1]["compute_ms"] > 0 and lines[-1]["protocol"] == "http"
        path = tmp_path / "t.json"
        for _ in range(200):  # the writer thread writes it whole
            if path.exists():
                break
            time.sleep(0.05)
        entries = json.loads(path.read_bytes())
        heads = [e for e in entries if "model_name" in e]
        assert [h["request_id"] for h in heads] == ["Traced-2"], heads
        names = [e["timestamps"][0]["name"] for e in entries if "timestamps" in e and e["id"] == heads[0]["id"]]
        assert names[0] == "HTTP_RECV_START" and "COMPUTE_END" in names and names[-1] == "HTTP_SEND_END", names


def test_a_client_gone_while_its_request_waits_cancels_it(models_dir, tmp_path, make_config):
    """The request waits in a batching window no test outlasts; its client goes: it leaves the
    queue at once (counted Cancelled), as aiohttp's handler cancellation does, and others are served."""
    depth = 'model="affine",priority="2",version="1"'
    with affine_server(models_dir, tmp_path, make_config, queue_size=4) as s:
        async def scenario():
            _, writer = await open_raw(s.url)
            writer.write(head_of(WAITING) + WAITING)
            await wait_for(lambda: metric(s.url, "aclserve_queue_depth", depth) == 1)
            writer.close()
            await wait_for(lambda: metric(s.url, "aclserve_queue_depth", depth) == 0)
        asyncio.run(scenario())
        assert metric(s.url, DIRECT) == 1
        assert metric(s.url, "aclserve_request_failure_total", 'model="affine",reason="Cancelled",version="1"') == 1


def test_shutdown_answers_a_direct_request_in_flight_then_closes(models_dir, tmp_path, make_config):
    """Stopped while a request waits in its batching window: it is answered (the drain), and its
    connection then ends."""
    s = affine_server(models_dir, tmp_path, make_config, 1500, queue_size=4)
    s.__enter__()
    depth = 'model="affine",priority="2",version="1"'

    async def scenario():
        reader, writer = await open_raw(s.url)
        writer.write(head_of(WAITING) + WAITING)
        await wait_for(lambda: metric(s.url, "aclserve_queue_depth", depth) == 1)
        stopping = asyncio.get_running_loop().run_in_executor(None, s.close)
        answer = await read_answer(reader)
        rest = await asyncio.wait_for(reader.read(), 30)  # b"": closed by the server
        await stopping
        writer.close()
        return answer, rest
    (status, _, body), rest = asyncio.run(scenario())
    assert status == 200 and json.loads(body)["outputs"][0]["shape"][0] == 3
    assert rest == b""


def test_an_app_given_its_own_middleware_answers_nothing_directly(models_dir, make_config):
    """A middleware added to the app must see every request, infer included."""
    config = make_config(models_dir)
    runtime = AclRuntime(device="cpu")
    app = create_app(config, ModelRepository(config, runtime), runtime)
    assert direct_answers(app) is not None

    @web.middleware
    async def spy(request, handler):
        return await handler(request)
    app.middlewares.append(spy)
    assert direct_answers(app) is None
    switched_off = create_app(make_config(models_dir, direct_infer=False), ModelRepository(config, runtime), runtime)
    assert direct_answers(switched_off) is None
