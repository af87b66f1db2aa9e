"""A header a request repeats is never read as its first copy alone (a tester, t44): the API token
passed as `Bearer <token>` then `Bearer wrong` (200) where the other order was a 401, over HTTP
and gRPC alike, and a body gzipped twice under two `Content-Encoding: gzip` headers was inflated
once (a misleading JSON error) where one `gzip, gzip` header is a 415. A repeated Authorization
is a 400 now, as a repeated Inference-Header-Content-Length is; repeated Content-Encoding headers
are the one list they make. The connection guard's early refusals leave such heads to aiohttp.
Real server on a real port; raw sockets where a client library would merge the headers."""
from __future__ import annotations

import asyncio
import gzip
import json

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.serving import ServerThread, free_port

from .full_queue import ONE_ROW, affine_server, fill_queue, refused_through_aiohttp, release
from .hostile import metric, open_raw, read_response

TOKEN = "s3cret-t0ken-for-tests"
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def raw_request(path: str, body: bytes, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines + [f"{k}: {v}" for k, v in headers]) + "\r\n\r\n").encode() + body


def answer(url: str, data: bytes) -> tuple[int, bytes]:
    async def go():
        reader, writer = await open_raw(url)
        writer.write(data)
        status, raw = await read_response(reader)
        writer.close()
        return status, raw.partition(b"\r\n\r\n")[2]
    return asyncio.run(go())


@pytest.fixture(scope="module")
def guarded(models_dir, make_config):
    with ServerThread(make_config(models_dir, api_token=TOKEN, auth_inference=True, grpc_port=free_port())) as srv:
        yield srv


@pytest.mark.parametrize("path", ["/v2/models/double/infer", "/v2/repository/index"])
def test_a_repeated_authorization_header_is_refused_in_either_order(guarded, path):
    good, wrong = ("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer wrong")
    body = GOOD if path.endswith("infer") else b"{}"
    assert answer(guarded.url, raw_request(path, body, [good]))[0] == 200
    for headers in ([good, wrong], [wrong, good], [good, good]):
        status, raw = answer(guarded.url, raw_request(path, body, headers))
        assert (status, json.loads(raw)) == (400, {"error": "Authorization is given 2 times; send it once"})
    assert metric(guarded.url, "aclserve_auth_refusals_total", 'reason="repeated_header"', TOKEN) >= 3


def test_repeated_authorization_metadata_is_refused_in_either_order(guarded):
    with grpc.insecure_channel(f"127.0.0.1:{guarded.config.grpc_port}") as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        good, wrong = ("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer wrong")
        assert stub.ModelReady(pb.ModelReadyRequest(name="double"), metadata=[good]).ready
        for metadata in ([good, wrong], [wrong, good]):
            for call, message in ((stub.ModelReady, pb.ModelReadyRequest(name="double")),
                                  (stub.RepositoryIndex, pb.RepositoryIndexRequest())):
                with pytest.raises(grpc.RpcError) as refused:
                    call(message, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details() == "Authorization is given 2 times; send it once"


def test_repeated_content_encoding_headers_are_one_list(server):
    path = "/v2/models/double/infer"
    twice = gzip.compress(gzip.compress(GOOD))
    as_one = answer(server.url, raw_request(path, twice, [("Content-Encoding", "gzip, gzip")]))
    as_two = answer(server.url, raw_request(path, twice, [("Content-Encoding", "gzip"), ("Content-Encoding", "gzip")]))
    assert as_one == as_two and as_two[0] == 415, as_two
    assert json.loads(as_two[1])["error"].startswith("Content-Encoding 'gzip, gzip' is not supported")
    once = answer(server.url, raw_request(path, gzip.compress(GOOD), [("Content-Encoding", "gzip")]))
    assert once[0] == 200, once


def test_a_transfer_coding_other_than_chunked_is_refused_501(server):
    """aiohttp's parser reads `gzip, chunked` as chunked and ignores the gzip: a body sent so was
    read as if it were not compressed (200 for a plain one, a JSON error for a gzipped one), where
    RFC 9112 6.1 has a server answer a transfer coding it does not know 501 (a reviewer)."""
    path = "/v2/models/double/infer"
    head = f"POST {path} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".encode()
    status, raw = answer(server.url, head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD))
    assert status == 501, (status, raw)
    assert json.loads(raw)["error"].startswith("Transfer-Encoding 'gzip, chunked' is not supported"), raw
    chunked = f"POST {path} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    assert answer(server.url, chunked + b"%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD))[0] == 200


def test_the_early_refusals_leave_repeated_headers_to_aiohttp(models_dir, tmp_path, make_config):
    """While the guard refuses early (the queue full), a head that repeats the JSON's length or
    names an encoding after `identity` was read by its first copy: a 503 where aiohttp answers
    400 (the length given twice) or 415 (the encodings' list)."""
    path = "/v2/models/affine/infer"
    length = ("Inference-Header-Content-Length", str(len(ONE_ROW)))
    cases = [([length, length], ONE_ROW), ([("Content-Encoding", "identity"), ("Content-Encoding", "gzip")],
                                           gzip.compress(ONE_ROW))]

    async def scenario(url):
        _, filler = await fill_queue(url)
        refused, other = await refused_through_aiohttp(url)  # the early refusals on from here
        statuses = [answer_in(url, raw_request(path, body, headers)) for headers, body in cases]
        statuses = [await status for status in statuses]
        await release(url)
        for w in (filler, other):
            w.close()
        return refused, statuses

    async def answer_in(url, data):
        reader, writer = await open_raw(url)
        writer.write(data)
        status, _ = await read_response(reader)
        writer.close()
        return status

    with affine_server(models_dir, tmp_path, make_config) as srv:
        refused, statuses = asyncio.run(scenario(srv.url))
    assert refused == 503 and statuses == [400, 415]
