"""Review of the early refusals (shedding.py), the request framing in the connection guard
(framing.py) and the batcher's count of requests admitted before they are read.

Real server on a real port, raw sockets. A partial batch waits in a queue of one place until the
test ends its wait (full_queue.py), so the queue is full without any test double. Durations are
only ever lower bounds the server or the test sets itself."""
import asyncio
import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.tiny_models import compile_cpu_om, save_graph

from .full_queue import (DEPTH, ONE_ROW, WAITING, affine_server, fill_queue, head_of, refused_through_aiohttp,
                         release, request)
from .hostile import metric, open_raw, read_response, wait_for

async def read_answers(reader, count: int) -> bytes:
    """At least `count` whole status lines of answers (the server closing first fails)."""
    answers = b""
    while answers.count(b"HTTP/1.1 ") < count:
        chunk = await asyncio.wait_for(reader.read(65536), 30)
        assert chunk, f"the server closed the connection after {answers[:200]!r}"
        answers += chunk
    return answers


@pytest.fixture
def long_window(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config) as srv:
        yield srv


def test_a_request_handed_to_aiohttp_before_any_refusal_is_answered_before_an_early_refusal(long_window):
    """The first request of a connection went to aiohttp while no refusal had been made (heads
    were only measured then); a refusal elsewhere turns the early refusals on; the next request
    pipelined on the first connection must not have its 503 written before the first's answer."""
    url = long_window.url

    async def scenario():
        reader, writer = await open_raw(url)
        writer.write(request(WAITING))  # waits in the queue's one place until released
        await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 1)
        other_reader, other = await open_raw(url)
        other.write(request(ONE_ROW))  # refused through aiohttp: heads are offered from now on
        refused_status, _ = await read_response(other_reader)
        writer.write(request(ONE_ROW))  # pipelined behind the queued request
        await release(url)  # sent after the pipelined request, so read after it
        answers = await read_answers(reader, 2)
        for w in (writer, other):
            w.close()
        return refused_status, answers

    refused_status, answers = asyncio.run(scenario())
    assert refused_status == 503
    assert answers.startswith(b"HTTP/1.1 200 "), answers[:200]


@pytest.fixture
def short_keepalive(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, 2500, keepalive_timeout_s=1.0) as srv:
        yield srv


def test_a_connection_whose_body_came_after_its_handler_started_is_not_closed_as_idle(short_keepalive):
    """The head, then the body once the handler reads it (as clients that send them apart do):
    the request then waits 2.5 s in its batch window, longer than the 1 s keep-alive timeout,
    and the connection is running a request, not idle."""
    url = short_keepalive.url

    async def scenario():
        reader, writer = await open_raw(url)
        writer.write(head_of(WAITING))
        await wait_for(lambda: metric(url, "aclserve_requests_in_flight") > 0)  # its handler runs
        writer.write(WAITING)
        answer = await read_response(reader)
        writer.close()
        return answer

    status, answer = asyncio.run(scenario())
    assert status == 200, answer[:200]
    assert metric(url, "aclserve_connections_closed_total", 'reason="idle_timeout"') == 0


CHUNKED = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"


@pytest.fixture
def short_header_timeout(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, 1, header_timeout_s=1.0) as srv:
        yield srv


def test_a_stalled_head_is_timed_out_after_a_request_the_guard_could_not_frame(short_header_timeout):
    """A chunked request makes the guard give up framing the connection; a head then sent a
    line every 0.2 s is still a head in progress, closed after header_timeout_s (1 s), not a
    connection kept alive by its trickle for the 8 s the test sends it."""
    url = short_header_timeout.url

    async def scenario():
        reader, writer = await open_raw(url)
        writer.write(CHUNKED)
        status, _ = await read_response(reader)
        closed = asyncio.ensure_future(reader.read())  # b"" once the server closes
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n")
        for _ in range(40):
            await asyncio.sleep(0.2)
            if closed.done():
                break
            try:
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
            except ConnectionError:
                break
        await asyncio.wait([closed], timeout=0.5)
        done = closed.done()
        closed.cancel()
        writer.close()
        return status, done

    status, closed = asyncio.run(scenario())
    assert status == 200
    assert closed, "a head trickled for 8 s was never timed out"
    assert metric(url, "aclserve_connections_closed_total", 'reason="header_timeout"') >= 1


@pytest.fixture
def two_places(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, queue_size=2) as srv:
        yield srv


async def refusing_with_room(url: str):
    """The early refusals on (a request refused through aiohttp while the two places were taken),
    then the queue empty again: (the refused request's status, its writer, to close)."""
    fillers = [await open_raw(url) for _ in range(2)]
    for _, w in fillers:
        w.write(request(WAITING))  # 3 + 3 rows fill no gear: both wait until their clients go
    await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 2)
    refused_reader, refused_writer = await open_raw(url)
    refused_writer.write(request(ONE_ROW))  # refused through aiohttp: early refusals on for 2 s
    refused_status, _ = await read_response(refused_reader)
    for _, w in fillers:
        w.close()  # cancelled: the queue is empty
    await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 0)
    return refused_status, refused_writer


def test_requests_admitted_unread_that_never_arrive_stop_counting_after_the_lapse(two_places):
    """Each infer request let through by the early refusal is counted as coming until its
    handler queues it; one that never does (here a body the codec refuses, 400) must not keep
    the queue's room taken longer than unread.LAPSE_S (50 ms) because others followed it. Two
    such requests at least 30 ms apart, then a valid one at least 60 ms after the first: the
    queue is empty and at most one of them is within the lapse, so it is served."""
    url = two_places.url

    async def scenario():
        refused_status, refused_writer = await refusing_with_room(url)
        reader, writer = await open_raw(url)
        statuses = []
        for _ in range(2):
            writer.write(request(b"{}"))  # admitted, then refused by the codec: never queued
            statuses.append((await read_response(reader))[0])
            await asyncio.sleep(0.03)
        writer.write(request(ONE_ROW))
        status, answer = await read_response(reader)
        for w in (writer, refused_writer):
            w.close()
        return refused_status, statuses, status, answer

    refused_status, statuses, status, answer = asyncio.run(scenario())
    assert refused_status == 503 and statuses == [400, 400]
    assert status == 200, answer[:300]


def test_requests_naming_another_level_do_not_count_against_the_default_levels_room(two_places):
    """The early refusals counted every request they let through against the default level's
    room until it was queued (or for unread.LAPSE_S), those naming another priority too: two
    requests at priority 1 that the codec then refused (400) made the next request of the
    default level, its level empty, 503 "priority level 2 queue is full" (found by a helper:
    a burst of priority-1 requests read in one pass of the loop did it to valid requests too).
    Only requests known to join the default level count now."""
    url = two_places.url
    other_level = json.dumps({"inputs": [], "parameters": {"priority": 1}}).encode()

    async def scenario():
        refused_status, refused_writer = await refusing_with_room(url)
        reader, writer = await open_raw(url)
        writer.write(request(other_level) * 2 + request(ONE_ROW))  # at once, well within the lapse
        answers = await read_answers(reader, 3)
        for w in (writer, refused_writer):
            w.close()
        return refused_status, answers

    refused_status, answers = asyncio.run(scenario())
    assert refused_status == 503
    assert re.findall(rb"HTTP/1.1 (\d+)", answers) == [b"400", b"400", b"200"], answers[-600:]


def test_a_burst_whose_bodies_come_after_their_heads_is_refused_early_beyond_the_room(two_places):
    """Five requests for two places, each body sent after its head: the change that counts
    only requests known to join the default level let them all through uncounted (their
    bodies not in hand), and aiohttp refused the three (found by the review of that change).
    Each is held back until its body has come, then counted: three early refusals."""
    url = two_places.url

    async def scenario():
        refused_status, refused_writer = await refusing_with_room(url)
        early = metric(url, "aclserve_early_refusals_total")
        clients = [await open_raw(url) for _ in range(5)]
        for _, w in clients:
            w.write(head_of(WAITING))
        await asyncio.sleep(0.02)
        for _, w in clients:
            w.write(WAITING)  # 3 rows each: two wait in the queue's two places, for good
        await wait_for(lambda: metric(url, "aclserve_early_refusals_total") - early == 3)
        await wait_for(lambda: metric(url, "aclserve_queue_depth", DEPTH) == 2)
        for w in [w for _, w in clients] + [refused_writer]:
            w.close()
        return refused_status

    assert asyncio.run(scenario()) == 503


def test_a_head_with_bare_line_feeds_goes_to_aiohttp_which_refuses_it(short_header_timeout):
    """The guard cannot frame a head whose lines end in a bare LF (no CRLF CRLF will come): it
    must hand it to aiohttp, which answers 400 at once, rather than wait for more of it until
    the header timeout closes the connection unanswered."""
    url = short_header_timeout.url

    async def scenario():
        reader, writer = await open_raw(url)
        writer.write(b"GET /v2/health/live HTTP/1.1\nHost: test\n\n")
        answer = await read_response(reader)
        writer.close()
        return answer

    status, answer = asyncio.run(scenario())
    assert status == 400, answer[:200]


@pytest.fixture
def keepalive_2s(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, keepalive_timeout_s=2.0) as srv:
        yield srv


def test_a_connection_whose_requests_are_refused_early_is_not_closed_as_idle(keepalive_2s):
    """A client sends a request every 0.3 s on one keep-alive connection while the queue stays
    full (its batch window outlasts the test): each is answered 503 by the guard. aiohttp, which never sees
    them, must not take the connection for an idle one and close it once keepalive_timeout_s
    (2 s) has passed since it opened; the test goes on for 3.6 s at least. Idle after that,
    it is closed by the guard's keep-alive sweep."""
    url = keepalive_2s.url

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        refused_first, first = await refused_through_aiohttp(url)  # early refusals on
        statuses = [refused_first]
        reader, writer = await open_raw(url)
        for _ in range(12):
            try:
                writer.write(request(ONE_ROW))
                await writer.drain()
                statuses.append((await read_response(reader))[0])  # 0: closed by the server
            except ConnectionError:
                statuses.append(0)
            if statuses[-1] == 0:
                break
            await asyncio.sleep(0.3)
        early = metric(url, "aclserve_early_refusals_total")
        idle_then = await read_response(reader)  # once it has been idle 2 s, it is closed
        for w in (waiting, first, writer):
            w.close()
        return statuses, early, idle_then

    statuses, early, idle_then = asyncio.run(scenario())
    assert statuses == [503] * 13, statuses
    assert early == 12
    assert idle_then == (0, b"")
    assert metric(url, "aclserve_connections_closed_total", 'reason="idle_timeout"') >= 1


def test_a_request_held_back_for_its_body_is_not_closed_by_aiohttp_as_idle(keepalive_2s):
    """A connection answered once by aiohttp, then a request the guard holds back until its
    body has come (to see whether it names a priority); the rest of the body comes 2.5 s
    later, after the keep-alive timeout (2 s) aiohttp set with its answer. aiohttp has not seen
    the request: it must not close the connection as idle meanwhile."""
    url = keepalive_2s.url

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        reader, writer = await open_raw(url)
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        live_status, _ = await read_response(reader)  # answered by aiohttp: its keep-alive timer runs
        refused_first, first = await refused_through_aiohttp(url)  # early refusals on
        refused_status = refused_first
        writer.write(head_of(ONE_ROW) + ONE_ROW[:10])  # held back for the rest of its body
        await asyncio.sleep(2.5)
        try:
            writer.write(ONE_ROW[10:])
            await writer.drain()
            status, _ = await read_response(reader)  # 0: closed by the server
        except ConnectionError:
            status = 0
        for w in (waiting, first, writer):
            w.close()
        return live_status, refused_status, status

    live_status, refused_status, status = asyncio.run(scenario())
    assert live_status == 200 and refused_status == 503
    assert status == 503  # the queue is still full (whoever answers)


WIDE = 262144  # values a row of the wide model answers: a JSON answer of a few MB


def wide_onnx(path) -> str:
    """y = x * W (FP32 [N,1] -> [N,WIDE], W random): a small request with a large answer."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDE])
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((1, WIDE)).astype(np.float32), "W")
    return save_graph(helper.make_graph([helper.make_node("Mul", ["x", "W"], ["y"])], "wide", [x], [y], [w]), path)


@pytest.fixture
def wide_beside_affine(models_dir, tmp_path, make_config):
    models, src = tmp_path / "models", tmp_path / "src"
    models.mkdir()
    src.mkdir()
    compile_cpu_om(wide_onnx(src / "wide.onnx"), models / "wide.om", batch="1")
    with affine_server(models_dir, models, make_config) as srv:
        yield srv


def test_an_early_refusal_does_not_overtake_an_answer_aiohttp_is_still_compressing(wide_beside_affine):
    """aiohttp compresses a large answer (Accept-Encoding) in a thread after the handler has
    returned; a request pipelined behind it meanwhile must not have its 503 written first. B is
    sent as soon as /metrics counts A's success, i.e. while A's answer is being compressed."""
    url = wide_beside_affine.url
    wide = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}).encode()
    a = (b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: test\r\nAccept-Encoding: gzip\r\n"
         b"Content-Length: %d\r\n\r\n%s" % (len(wide), wide))

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        refused_first, first = await refused_through_aiohttp(url)  # early refusals on
        refused_status = refused_first
        reader, writer = await open_raw(url)
        writer.write(a)
        while metric(url, "aclserve_request_success_total", 'model="wide",version="1"') < 1:
            pass  # blocking polls: the server's loop is free while it compresses
        writer.write(request(ONE_ROW))  # affine, whose queue is full
        answers = await read_answers(reader, 2)
        for w in (waiting, first, writer):
            w.close()
        return refused_status, answers

    refused_status, answers = asyncio.run(scenario())
    assert refused_status == 503
    assert answers.startswith(b"HTTP/1.1 200 ") and b"Content-Encoding: gzip" in answers[:300], answers[:300]


def test_a_request_that_ends_its_connection_in_any_spelling_aiohttp_reads_goes_to_aiohttp(keepalive_2s):
    """aiohttp ends the connection after a request whose Connection header names close, also
    after OWS that is a tab or in a second Connection line. The guard must leave such requests
    to aiohttp (whose 503 says Connection: close), not refuse them early with a 503 that keeps
    the connection open and goes on reading requests after it."""
    url = keepalive_2s.url
    spellings = (b"Connection: keep-alive\r\nConnection: close\r\n", b"Connection: keep-alive,\tclose\r\n",
                 b"Connection: Keep-Alive , close\r\n")

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        refused_first, first = await refused_through_aiohttp(url)  # early refusals on
        statuses, answers, writers = [refused_first], [], []
        for connection in spellings:
            reader, writer = await open_raw(url)
            head = head_of(ONE_ROW)
            writer.write(head[:-2] + connection + b"\r\n" + ONE_ROW)
            status, answer = await read_response(reader)
            statuses.append(status)
            answers.append(answer.lower())
            writers.append(writer)
        early = metric(url, "aclserve_early_refusals_total")
        for w in [waiting, first] + writers:
            w.close()
        return statuses, answers, early

    statuses, answers, early = asyncio.run(scenario())
    assert statuses == [503] * 4, statuses
    assert early == 0
    assert all(b"\r\nconnection: close\r\n" in answer for answer in answers), answers
