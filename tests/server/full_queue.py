"""A full queue without any test double, for the overload tests: the affine model with a queue
of one place and a batching window no test outlasts (HELD_WINDOW_MS), so that one waiting
request fills it until the test ends the wait (raw sockets): `release` sends the rows that fill
its batch, which then runs at once, or the test closes the waiting connection (the request is
cancelled). A window that ended on its own made the tests depend on the machine's speed. The same
waiting request holds a shutdown's drain open for as long as a test needs (held_drain)."""
from __future__ import annotations

import contextlib
import json
import shutil
import socket
import time
import urllib.error
import urllib.request

from tests.serving import ServerThread

from .hostile import metric, open_raw, read_response, wait_for

WAITING = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [1.0] * 24},
                                 {"name": "idx", "datatype": "INT64", "shape": [3, 3], "data": [1] * 9}]}).encode()
ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                 {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}).encode()
# Priority 1 (a queue of its own, with room) and 5 rows: with WAITING's 3 they fill the largest
# gear (8), so the batch runs at once and holds both whatever the measured gear costs (a
# smaller top-level request may be run alone on its own gear: composition.py, level_cut).
RELEASE = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 8], "data": [1.0] * 40},
                                 {"name": "idx", "datatype": "INT64", "shape": [5, 3], "data": [1] * 15}],
                      "parameters": {"priority": 1}}).encode()
DEPTH = 'model="affine",priority="2",version="1"'  # the default level's queue depth labels
HELD_WINDOW_MS = 60_000  # far longer than any test: only the test ends a partial batch's wait


def head_of(body: bytes) -> bytes:
    return (b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))


def request(body: bytes) -> bytes:
    return head_of(body) + body


def affine_server(models_dir, tmp_path, make_config, window_ms: int = HELD_WINDOW_MS, queue_size: int = 1,
                  execution_timeout_ms: int = 0, **config) -> ServerThread:
    """The affine model alone, its default level `queue_size` places, a partial batch waiting
    `window_ms`, executions timed out after `execution_timeout_ms` (0: the model's default);
    `config` overrides server keys."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    timeout = f"execution_timeout_ms: {execution_timeout_ms}\n" if execution_timeout_ms else ""
    (tmp_path / "affine.yaml").write_text(
        f"batching: {{max_queue_delay_ms: {window_ms}, default_queue_policy: {{max_queue_size: {queue_size}}}}}\n"
        + timeout)
    return ServerThread(make_config(tmp_path, model_control_mode="none", **config))


async def fill_queue(url: str):
    """The queue's one place taken until `release` or the writer's close: (its reader, its writer)."""
    reader, writer = await open_raw(url)
    writer.write(request(WAITING))
    await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 1)
    return reader, writer


async def refused_through_aiohttp(url: str):
    """A request refused through aiohttp, which turns the guard's checks on: (status, writer)."""
    reader, writer = await open_raw(url)
    writer.write(request(ONE_ROW))
    return (await read_response(reader))[0], writer


async def release(url: str) -> None:
    """End the wait of the request `fill_queue` queued: RELEASE fills its batch, which runs at
    once; both are answered 200 (the waiting one on its own connection)."""
    reader, writer = await open_raw(url)
    writer.write(request(RELEASE))
    status, answer = await read_response(reader)
    writer.close()
    assert status == 200, answer[:300]


def status_of(url: str, path: str) -> int:
    """The HTTP status of one GET of `path` at `url` (host:port), on a connection of its own."""
    try:
        return urllib.request.urlopen(f"http://{url}{path}", timeout=30).status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


@contextlib.contextmanager
def held_drain(models_dir, tmp_path, make_config, **config):
    """A server of the affine model (a batching window no test outlasts; `config` overrides server
    keys) whose shutdown drain has begun, as on SIGTERM, and is held open by a request waiting in
    its queue until the block ends: then that request is cancelled (its connection closed), the
    drain ends and the server must stop cleanly. Yields the server."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(f"batching: {{max_queue_delay_ms: {HELD_WINDOW_MS}}}\n")
    server = ServerThread(make_config(tmp_path, model_control_mode="none", shutdown_timeout_s=120, **config)).start()
    host, port = server.url.rsplit(":", 1)
    waiting = socket.create_connection((host, int(port)), timeout=30)
    try:
        waiting.sendall(request(WAITING))
        while metric(server.url, "aclserve_queue_depth", DEPTH) != 1:
            time.sleep(0.02)
        server.begin_close()  # as SIGTERM: the drain begins
        while status_of(server.url, "/v2/health/ready") != 503:
            time.sleep(0.02)
        yield server
        waiting.close()  # its request is cancelled: the drain ends
        server.close()
        assert not server._thread.is_alive() and server.error is None
    finally:
        waiting.close()
        server.close()
