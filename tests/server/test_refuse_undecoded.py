"""A request naming no priority, for a level that is full, is refused before its JSON is
decoded (shedding.refuse_undecoded): on both HTTP paths (the guard's direct answers and
aiohttp's), whether or not the guard sheds. A body that is not JSON at all shows it: refused
503 while the queue is full (decoding it would have said 400), 400 once there is room."""
import asyncio
import json
import logging

import pytest

from .full_queue import affine_server, fill_queue, head_of, release
from .hostile import metric, open_raw, read_response

NOT_JSON = b'{"inputs": [' + b" " * 70_000 + b"not json"  # over the guard's BODY_PEEK_BYTES
NAMES_PRIORITY = b'{"parameters": {"priority": 2}, "inputs": [' + b" " * 10 + b"not json"


@pytest.fixture
def full_affine(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, shed_before_parsing=False) as srv:
        yield srv


def send(body: bytes, extra: bytes = b"") -> bytes:
    head = head_of(body)
    return head[:-2] + extra + b"\r\n" + body


@pytest.mark.parametrize("path, extra", [("direct", b""), ("aiohttp", b"Accept-Encoding: gzip\r\n")])
def test_a_request_for_a_full_level_is_refused_before_its_json_is_decoded(full_affine, path, extra):
    url = full_affine.url

    async def one(body: bytes):
        reader, writer = await open_raw(url)
        writer.write(send(body, extra))
        answer = await read_response(reader)
        writer.close()
        return answer

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        refused = await one(NOT_JSON)
        named = await one(NAMES_PRIORITY)  # it may name another level: decoded, so refused as not JSON
        await release(url)
        await read_response(waiting_reader)
        waiting.close()
        with_room = await one(NOT_JSON)
        return refused, named, with_room

    (status, answer), (named_status, named_answer), (room_status, room_answer) = asyncio.run(scenario())
    assert status == 503 and b"the queue is full" in answer, answer
    assert named_status == 400 and b"not valid JSON" in named_answer, named_answer
    assert room_status == 400 and b"not valid JSON" in room_answer, room_answer
    assert metric(url, "aclserve_request_failure_total", 'model="affine",reason="QueueFull",version="1"') == 1


def test_a_refusal_before_the_decode_is_logged_with_the_header_request_id(models_dir, tmp_path, make_config, caplog):
    """With the request log on (every request through aiohttp's path) a request refused before
    its body is decoded is logged with its X-Request-Id, as the guard's early refusals are: it
    was logged with no id at all (the id was only taken when the body was decoded)."""
    import logging
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    with affine_server(models_dir, tmp_path, make_config, request_log=True) as srv:
        async def scenario():
            waiting_reader, waiting = await fill_queue(srv.url)
            reader, writer = await open_raw(srv.url)
            writer.write(send(NOT_JSON, b"X-Request-Id: over-1\r\n"))
            answer = await read_response(reader)
            writer.close()
            await release(srv.url)
            await read_response(waiting_reader)
            waiting.close()
            return answer
        status, answer = asyncio.run(scenario())
    assert status == 503 and b"queue is full" in answer, answer
    (line,) = [r.fields for r in caplog.records if r.name == "aclserve.requests" and r.fields["status"] == 503]
    assert line["request_id"] == "over-1"


def _stating(request_id: str | None, **extra) -> bytes:
    """A valid JSON body of the affine model, stating `request_id` when not None."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8},
                       {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}], **extra}
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body).encode()


def _binary_stating(request_id: str) -> tuple[bytes, bytes]:
    """A binary-tensors body stating `request_id` in its JSON part: (its extra headers, the body)."""
    header = json.dumps({"id": request_id, "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 8], "parameters": {"binary_data_size": 32}},
        {"name": "idx", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]}).encode()
    return b"Inference-Header-Content-Length: %d\r\n" % len(header), header + bytes(32) + bytes(24)


@pytest.mark.parametrize("path, extra", [("direct", b""), ("aiohttp", b"Accept-Encoding: gzip\r\n")])
def test_a_refusal_before_the_decode_is_named_by_its_body_s_id_and_traced_like_grpc_s(
        models_dir, tmp_path, make_config, caplog, path, extra):
    """A request refused before its body is decoded kept only its X-Request-Id in the request log
    and the trace (its body's `id` was lost, as tritonclient sends it) and its Triton-format trace
    had no REQUEST_START or REQUEST_END, which a gRPC refusal has. Its body's own id names it now
    when its JSON part is at most shedding.ID_READ_BYTES (parsed for it: binary tensors' JSON, a
    small model's); a larger one keeps the header's (the decode the refusal saves), and an "id" in
    a nested object is not the request's."""
    from aclserve.server.shedding import ID_READ_BYTES
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    binary_headers, binary = _binary_stating("body-binary")
    large = _stating("body-large") + b" " * ID_READ_BYTES  # (whitespace after the object: valid JSON)
    sent = {"hdr-small": (b"", _stating("body-small")), "hdr-binary": (binary_headers, binary),
            "hdr-nested": (b"", _stating(None, parameters={"tags": {"id": "nested"}})),
            "hdr-large": (b"", large)}
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": "triton"}
    with affine_server(models_dir, tmp_path, make_config, request_log=True, trace=trace,
                       trace_dir=str(tmp_path / "traces")) as srv:
        async def scenario():
            waiting_reader, waiting = await fill_queue(srv.url)
            answers = []
            for header_id, (headers, body) in sent.items():
                reader, writer = await open_raw(srv.url)
                writer.write(send(body, extra + headers + b"X-Request-Id: %s\r\n" % header_id.encode()))
                answers.append(await read_response(reader))
                writer.close()
            await release(srv.url)
            await read_response(waiting_reader)
            waiting.close()
            return answers
        answers = asyncio.run(scenario())
        assert metric(srv.url, "aclserve_request_failure_total", 'model="affine",reason="QueueFull",version="1"') == 4
    assert all(status == 503 and b"queue is full" in answer for status, answer in answers), answers
    logged = [r.fields["request_id"] for r in caplog.records
              if r.name == "aclserve.requests" and r.fields["status"] == 503]
    expected = ["body-small", "body-binary", "hdr-nested", "hdr-large"]
    assert logged == expected
    entries = json.loads((tmp_path / "trace.json").read_bytes())
    ids = {e["request_id"]: e["id"] for e in entries if "request_id" in e}  # (the queue's filler and release: none)
    for rid in expected:
        stamps = [e["timestamps"][0]["name"] for e in entries if e["id"] == ids[rid] and "timestamps" in e]
        assert stamps == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "REQUEST_END", "HTTP_SEND_START",
                          "HTTP_SEND_END"], (rid, stamps)
