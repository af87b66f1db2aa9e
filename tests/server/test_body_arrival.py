"""A request body is charged to the memory budget as its bytes arrive, not as its Content-Length
declares: heads declaring large bodies and sending nothing held the whole budget (8 heads of
64 MiB, 960 bytes sent, held the 512 MiB for body_timeout_s: every other HTTP and gRPC infer got
503, found by a tester). The real server on a real port, raw sockets for the clients that stall."""
from __future__ import annotations

import asyncio
import json

import pytest

from aclserve.server.stalled_bodies import STALL_S
from tests.serving import ServerThread

from .hostile import closed_by_server, head, lingering, metric, open_raw, read_response, stalled_upload, wait_for

MiB = 1 << 20
INFER = "/v2/models/double/infer"
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def config(models_dir, make_config):
    # bodies all JSON are held to max_body_bytes here (not max_json_bytes first)
    return make_config(models_dir, max_body_bytes=4 * MiB, max_request_bytes=4 * MiB, max_json_bytes=4 * MiB,
                       max_inflight_bytes=4 * MiB)


@pytest.fixture(scope="module")
def server(models_dir, make_config):
    with ServerThread(config(models_dir, make_config)) as srv:
        yield srv


@pytest.fixture
def server_closing_soon(models_dir, make_config):
    """`server` closing a connection 2 s after it refused or ended a body still to come, not 10 s
    (its test waited that long for the close it checks): time enough to read the rest of a body
    sent whole after its head (1.5 MiB on the loopback), and none comes to the one it ends."""
    with lingering(2.0), ServerThread(config(models_dir, make_config)) as srv:
        yield srv


def padded(length: int) -> bytes:
    """GOOD after spaces (JSON allows them), `length` bytes in all."""
    return b" " * (length - len(GOOD)) + GOOD


def in_use(url: str) -> float:
    return metric(url, "aclserve_request_memory_bytes")


async def post(url: str, body: bytes) -> tuple[int, bytes]:
    reader, writer = await open_raw(url)
    writer.write(head(INFER, {"Content-Length": len(body)}) + body)
    answer = await read_response(reader)
    writer.close()
    return answer


def test_heads_declaring_large_bodies_hold_nothing_and_others_are_served(server):
    """8 requests declaring 2 MiB each (the 4 MiB budget 4 times over): 3 send their head alone, 3 ask
    `Expect: 100-continue`, are told to continue and send nothing, 2 send one byte. They hold
    the byte each of the 2 sent, and a request of another client is served."""
    refused_before = metric(server.url, "aclserve_request_memory_refused_total", 'status="503"')

    async def scenario():
        stalled, continued = [], []
        for kind in ["head"] * 3 + ["expect"] * 3 + ["byte"] * 2:
            reader, writer = await open_raw(server.url)
            headers = {"Content-Length": 2 * MiB, **({"Expect": "100-continue"} if kind == "expect" else {})}
            writer.write(head(INFER, headers) + (b"{" if kind == "byte" else b""))
            if kind == "expect":
                continued.append((await read_response(reader))[0])
            stalled.append(writer)
        # every one is in its handler, reading its body (or was refused: before, all but the first)
        await wait_for(lambda: metric(server.url, "aclserve_requests_in_flight")
                       + metric(server.url, "aclserve_request_memory_refused_total", 'status="503"')
                       - refused_before >= 8 and in_use(server.url) >= 2)
        held = in_use(server.url)
        served = await post(server.url, GOOD)
        for writer in stalled:
            writer.close()
        await wait_for(lambda: in_use(server.url) == 0 and metric(server.url, "aclserve_requests_in_flight") == 0)
        return continued, held, served
    continued, held, (status, answer) = asyncio.run(scenario())
    assert continued == [100] * 3
    assert held == 2  # the 2 bytes sent: not 2 MiB of each declared length
    assert status == 200 and b'"outputs"' in answer, answer[:300]


def test_a_body_is_charged_as_it_comes_and_one_outgrowing_the_budget_is_refused_midway(server):
    """A declares 3 MiB and sends 1: it holds about 1 MiB (a quarter ahead at most), so B,
    declaring 1.5 MiB, is let in (before, A held its 3 MiB at once and B got 503 at its head).
    B sends most of its body; A's next 2 MiB do not fit then: A gets 503 with Retry-After and
    its connection closes; B, whose bytes were all charged as they came, is served (stalled
    meanwhile, it is not ended for A: a body refused while it arrives is no fresh request)."""
    async def scenario():
        a_reader, a = await open_raw(server.url)
        a.write(head(INFER, {"Content-Length": 3 * MiB}) + b" " * MiB)
        await wait_for(lambda: in_use(server.url) >= MiB)
        a_holds = in_use(server.url)
        b_body = padded(3 * MiB // 2)
        b_reader, b = await open_raw(server.url)
        b.write(head(INFER, {"Content-Length": len(b_body)}) + b_body[:MiB])
        await wait_for(lambda: in_use(server.url) >= a_holds + MiB)
        await asyncio.sleep(STALL_S + 0.1)  # B is stalled now, but A, refused while it arrives, ends no body
        a.write(b" " * (2 * MiB))  # (read and dropped once refused, so the answer is not reset)
        a_answer = await read_response(a_reader)
        a_closed = await closed_by_server(a_reader)
        b.write(b_body[MiB:])
        b_answer = await read_response(b_reader)
        a.close()
        b.close()
        await wait_for(lambda: in_use(server.url) == 0)
        return a_holds, a_answer, a_closed, b_answer
    a_holds, (a_status, a_answer), a_closed, (b_status, b_answer) = asyncio.run(scenario())
    assert MiB <= a_holds <= MiB + MiB // 4
    assert a_status == 503 and b"max_inflight_bytes" in a_answer, a_answer[:300]
    assert b"\r\nRetry-After: " in a_answer and b"\r\nConnection: close\r\n" in a_answer and a_closed, a_answer
    assert b_status == 200 and b'"outputs"' in b_answer, b_answer[:300]


def test_a_stalled_body_is_ended_when_another_request_is_refused_for_its_memory(server_closing_soon):
    """An upload that stops after 3 MiB of the 4 MiB budget held them until body_timeout_s (here
    60 s): a 1.5 MiB request is refused (503, Retry-After), and the upload, stalled for STALL_S,
    is ended then (408, closed) as its 3 MiB make room; the refused request's retry is served."""
    url = server_closing_soon.url
    ended_before = metric(url, "aclserve_stalled_bodies_ended_total")

    async def scenario():
        stall_reader, stall = await stalled_upload(url, 3 * MiB)
        await asyncio.sleep(STALL_S + 0.1)  # stalled now
        body = padded(3 * MiB // 2)
        refused = await post(url, body)
        ended = await read_response(stall_reader)
        closed = await closed_by_server(stall_reader)
        stall.close()
        await wait_for(lambda: in_use(url) == 0)
        retried = await post(url, body)
        return refused, ended, closed, retried
    (status, answer), (ended_status, ended), closed, (retried_status, retried) = asyncio.run(scenario())
    assert status == 503 and b"\r\nRetry-After: " in answer and b"max_inflight_bytes" in answer, answer[:300]
    assert ended_status == 408 and b"request body ended: no byte of it came for 1 s" in ended and closed, ended[:400]
    assert retried_status == 200 and b'"outputs"' in retried, retried[:300]
    assert metric(url, "aclserve_stalled_bodies_ended_total") == ended_before + 1
