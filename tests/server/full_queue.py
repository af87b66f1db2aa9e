"""A full queue without any test double, for the overload tests: the affine model with a queue
of one place and a long batching window, so that one waiting request fills it (raw sockets)."""
from __future__ import annotations

import json
import shutil

from tests.serving import ServerThread

from .hostile import metric, open_raw, read_response, wait_for

WAITING = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [1.0] * 24},
                                 {"name": "idx", "datatype": "INT64", "shape": [3, 3], "data": [1] * 9}]}).encode()
ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                 {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}).encode()
DEPTH = 'model="affine",priority="2",version="1"'  # the default level's queue depth labels


def head_of(body: bytes) -> bytes:
    return (b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))


def request(body: bytes) -> bytes:
    return head_of(body) + body


def affine_server(models_dir, tmp_path, make_config, window_ms: int, queue_size: int = 1, **config) -> ServerThread:
    """The affine model alone, its default level `queue_size` places, a partial batch waiting
    `window_ms`; `config` overrides server keys."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(
        f"batching: {{max_queue_delay_ms: {window_ms}, default_queue_policy: {{max_queue_size: {queue_size}}}}}\n")
    return ServerThread(make_config(tmp_path, model_control_mode="none", **config))


async def fill_queue(url: str):
    """The queue's one place taken for the batching window: (its reader, its writer)."""
    reader, writer = await open_raw(url)
    writer.write(request(WAITING))
    await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 1)
    return reader, writer


async def refused_through_aiohttp(url: str):
    """A request refused through aiohttp, which turns the guard's checks on: (status, writer)."""
    reader, writer = await open_raw(url)
    writer.write(request(ONE_ROW))
    return (await read_response(reader))[0], writer
