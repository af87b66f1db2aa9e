"""A server on loopback without an API token takes load/unload and trace setting changes from
clients on the machine, and a browser there runs every site's pages: their requests are refused
(server/web_pages.py). A page's "simple" cross-origin POST (text/plain, no preflight) unloaded a
model and changed the trace settings of a default server, and through DNS rebinding (a name of
the page's own site resolving to 127.0.0.1) a page could do so and read the answers (a tester).
The requests here are a browser's as it sends them: its Origin, and the page's host in Host."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import tritonclient.http as triton

from tests.server.hostile import metric, open_raw, read_response
from tests.serving import ServerThread, request

EVIL = "http://evil.example"
PAGE = {"Origin": EVIL, "Content-Type": "text/plain"}  # fetch(url, {method: "POST", mode: "no-cors", body})
CONTROL = ["/v2/repository/models/double/unload", "/v2/repository/models/double/load",
           "/v2/repository/other/models/double/unload", "/v2/trace/setting", "/v2/models/double/trace/setting"]
TOKEN = "web-pages-t0ken"


@pytest.fixture(scope="module")
def srv(models_dir, make_config):
    """A default server: 127.0.0.1, no API token."""
    with ServerThread(make_config(models_dir)) as server:
        yield server


def rebinding(server) -> dict:
    """A page of rebind.evil.example, once its name resolves to 127.0.0.1: same-origin to the browser."""
    port = server.url.rsplit(":", 1)[1]
    return {"Host": f"rebind.evil.example:{port}", "Origin": f"http://rebind.evil.example:{port}",
            "Content-Type": "text/plain"}


def untouched(server) -> None:
    """The model still serves, the trace settings as they were."""
    assert request(server, "GET", "/v2/models/double/ready")[0] == 200
    status, _, body = request(server, "GET", "/v2/trace/setting")
    assert status == 200 and json.loads(body)["trace_rate"] == "1000"


@pytest.mark.parametrize("path", CONTROL)
@pytest.mark.parametrize("page", ["cross-origin", "rebinding", "rebinding, no Origin", "null origin",
                                  "another port of localhost"])
def test_a_web_pages_control_request_is_refused(srv, path, page):
    port = srv.url.rsplit(":", 1)[1]
    headers = {"cross-origin": PAGE, "rebinding": rebinding(srv),
               "rebinding, no Origin": {"Host": f"rebind.evil.example:{port}"},
               "null origin": {"Origin": "null", "Content-Type": "text/plain"},  # a file:// page, a sandbox
               "another port of localhost": {"Origin": "http://localhost:3000"}}[page]
    refused = metric(srv.url, "aclserve_auth_refusals_total", 'reason="web_page"')
    status, answer_headers, body = request(srv, "POST", path, data=b'{"trace_rate": "7"}', headers=headers)
    assert status == 403, body
    assert answer_headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert "refused to requests from web pages" in error and "api_token" in error, error
    assert ("Host, \"rebind.evil.example:" in error) == page.startswith("rebinding"), error
    assert metric(srv.url, "aclserve_auth_refusals_total", 'reason="web_page"') == refused + 1
    untouched(srv)


def test_clients_that_are_not_browsers_keep_control(srv):
    """curl, tritonclient, urllib, aiohttp send no Origin and name the address they connect to
    (127.0.0.1, localhost); a page of the server's own origin (it serves none) passes too."""
    port = srv.url.rsplit(":", 1)[1]
    client = triton.InferenceServerClient(srv.url)
    try:
        client.unload_model("double")
        assert not client.is_model_ready("double")
        client.load_model("double")
        assert client.is_model_ready("double")
        assert client.update_trace_settings(settings={"trace_rate": "9"})["trace_rate"] == "9"
    finally:
        client.close()
    local = urllib.request.Request(f"http://localhost:{port}/v2/trace/setting", data=b'{"trace_rate": "1000"}')
    with urllib.request.urlopen(local, timeout=60) as answer:
        assert json.loads(answer.read())["trace_rate"] == "1000"
    own_origins = ({"Origin": f"http://{srv.url}"}, {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"})
    for headers in own_origins + ({"Host": f"[::1]:{port}"}, {"Host": "LOCALHOST"}, {"Host": f"0.0.0.0:{port}"}):
        status, _, body = request(srv, "POST", "/v2/repository/models/double/load", headers=headers)
        assert status == 200, (headers, body)
    untouched(srv)


def test_inference_metadata_and_the_index_stay_open_to_web_pages(srv):
    """Only control is refused: a reverse proxy may hand a public Host to a loopback server."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
    for headers in (PAGE, rebinding(srv)):
        assert request(srv, "POST", "/v2/models/double/infer", data=body.encode(), headers=headers)[0] == 200
        assert request(srv, "GET", "/v2/models/double", headers=headers)[0] == 200
        assert request(srv, "POST", "/v2/repository/index", headers=headers)[0] == 200
        assert request(srv, "GET", "/v2/trace/setting", headers=headers)[0] == 200


async def _raw(url: str, data: bytes) -> tuple[int, bytes]:
    reader, writer = await open_raw(url)
    try:
        writer.write(data)
        return await read_response(reader)
    finally:
        writer.close()


def test_a_web_pages_request_in_one_write_is_refused(srv):
    """Head and body in one write, as the connection guard frames a request it may answer itself
    (direct.py answers infer paths alone: a control route goes to aiohttp and its check)."""
    body = b"{}"
    data = (b"POST /v2/repository/models/double/unload HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: " + EVIL.encode()
            + b"\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    status, answer = asyncio.run(_raw(srv.url, data))
    assert status == 403 and b"web pages" in answer, answer
    untouched(srv)


def test_a_web_pages_request_is_refused_before_100_continue(srv):
    """The expect handler makes the route's check before it asks for the body (expect.py)."""
    data = (b"POST /v2/trace/setting HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: " + EVIL.encode()
            + b"\r\nContent-Length: 19\r\nExpect: 100-continue\r\n\r\n")
    status, answer = asyncio.run(_raw(srv.url, data))
    assert status == 403 and b"web pages" in answer, answer
    untouched(srv)


PREFLIGHT = {"Origin": EVIL, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@pytest.mark.parametrize("path", CONTROL + ["/v2/models/double/infer", "/v2/repository/index"])
def test_no_preflight_is_granted(srv, path):
    """A page may send Authorization (or a JSON Content-Type) cross-origin only once a preflight
    allows it: the server answers none with a CORS header, so with a token set a page can do
    nothing, and nothing changes there."""
    status, headers, _ = request(srv, "OPTIONS", path, headers=PREFLIGHT)
    assert status >= 400 and not [h for h in headers if h.lower().startswith("access-control-")], (status, headers)


def test_with_a_token_nothing_changes(models_dir, make_config):
    with ServerThread(make_config(models_dir, api_token=TOKEN)) as server:
        assert request(server, "POST", "/v2/repository/models/double/unload", headers=PAGE)[0] == 401
        status, headers, _ = request(server, "OPTIONS", "/v2/repository/models/double/unload", headers=PREFLIGHT)
        assert status >= 400 and "Access-Control-Allow-Origin" not in headers
        with_token = dict(rebinding(server), Authorization=f"Bearer {TOKEN}")
        assert request(server, "POST", "/v2/repository/models/double/unload", headers=with_token)[0] == 200
        assert request(server, "POST", "/v2/repository/models/double/load", headers=with_token)[0] == 200
