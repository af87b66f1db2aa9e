"""Overload refusals hold their connection for the Retry-After they announce.

A partial batch waits in a queue of one until the test releases it (full_queue.py), so a second
request finds the queue full without any test double. The one duration checked is a lower
bound the server sets itself (the hold), never a speed."""
import asyncio
import json
import shutil
import urllib.request

import pytest

from aclserve.server import holds, stalled_bodies
from aclserve.server.connections import BODY_LINGER_S
from aclserve.server.holds import HOLD_MAX_S, PENDING_BODY_HOLD_S, REFUSALS_PER_S, hold_seconds
from tests.serving import ServerThread

from .full_queue import ONE_ROW, affine_server, fill_queue, refused_through_aiohttp, release, request
from .hostile import head, metric, open_raw, read_response, stalled_upload, wait_for

@pytest.fixture
def one_slot(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, hold_refused_connections=True) as srv:
        yield srv


async def refuse_then_send_again(url: str, room_first: bool = False):
    """Fill the queue's one place, have a request refused, send the next one on the same
    connection at once (`room_first`: once the queue is released, else while it is still full):
    (refusal status, refusal, held then, next status, whether it was answered within 0.3 s of
    its sending, the queued request's status)."""
    waiting_reader, waiting = await fill_queue(url)
    reader, writer = await open_raw(url)
    writer.write(request(ONE_ROW))
    status, answer = await read_response(reader)
    held_now = metric(url, "aclserve_connections_held")
    if room_first:
        await release(url)
    writer.write(request(ONE_ROW))  # sent at once: read only after the hold
    next_answer = asyncio.ensure_future(read_response(reader))
    await asyncio.sleep(0.3)
    answered_early = next_answer.done()  # within 0.3 s of its sending, the hold being 1 s
    status_after, _ = await next_answer
    if not room_first:
        await release(url)
    first_status, _ = await read_response(waiting_reader)
    for w in (writer, waiting):
        w.close()
    return status, answer, held_now, status_after, answered_early, first_status


def test_a_held_connection_is_read_again_once_the_queue_has_room(one_slot):
    status, answer, held_now, status_after, _, first_status = asyncio.run(
        refuse_then_send_again(one_slot.url, room_first=True))
    assert status == 503 and b"queue is full" in answer and b"\r\nRetry-After: 1\r\n" in answer
    assert held_now == 1
    # read again after its hold, the queue released meanwhile (that a held connection is not
    # read while the queue is full: the next test)
    assert status_after == 200 and first_status == 200
    assert metric(one_slot.url, "aclserve_connection_holds_total") == 1
    assert metric(one_slot.url, "aclserve_connections_held") == 0


def test_a_held_connection_is_not_read_before_its_retry_after_while_the_queue_is_full(one_slot):
    status, _, held_now, status_after, answered_early, first_status = asyncio.run(
        refuse_then_send_again(one_slot.url))
    assert status == 503 and held_now == 1
    assert status_after == 503  # read after the hold of 1 s: the queue was still full (not released yet)
    assert not answered_early  # not read (so not refused again at once) while the server held it
    assert first_status == 200
    assert metric(one_slot.url, "aclserve_connection_holds_total") == 2  # held again after the second


def test_the_hold_grows_with_the_connections_held():
    assert hold_seconds(1, 15) == 1
    assert hold_seconds(REFUSALS_PER_S, 15) == 1
    assert hold_seconds(REFUSALS_PER_S + 1, 15) == 2
    assert hold_seconds(4 * REFUSALS_PER_S, 15) == 4
    assert hold_seconds(1_000_000, 15) == HOLD_MAX_S
    assert hold_seconds(1_000_000, 3) == 2  # below the keep-alive timeout: the sweep would close it
    assert hold_seconds(1, 1.5) == 1
    assert hold_seconds(1, 1.2) == 0 and hold_seconds(1, 0.5) == 0  # no whole second left: no hold


def test_a_refusal_before_its_body_arrived_is_held_less_than_the_body_lingers():
    assert PENDING_BODY_HOLD_S < BODY_LINGER_S
    assert hold_seconds(1_000_000, 15, body_pending=True) == PENDING_BODY_HOLD_S
    assert hold_seconds(1_000_000, 15, body_pending=False) == HOLD_MAX_S


DECLARED = 200_000  # one such body fits the budget below, two do not


@pytest.fixture
def small_budget(models_dir, tmp_path, make_config, monkeypatch):
    # A tenth of a refusal a second: the second connection held gets the longest hold, 10 s (as
    # the 2,500th does with the real figure), as long as aiohttp reads a dropped body.
    monkeypatch.setattr(holds, "REFUSALS_PER_S", 0.1)
    # and the stalled body that fills the budget is never ended for the requests it refuses
    monkeypatch.setattr(stalled_bodies, "STALL_S", 3600.0)
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    config = make_config(tmp_path, model_control_mode="none", max_inflight_bytes=300_000,
                         max_request_bytes=250_000, hold_refused_connections=True)
    with ServerThread(config) as srv:
        yield srv


def test_a_connection_refused_before_its_body_arrived_is_kept(small_budget):
    """The refused request's body comes after its 503; aiohttp reads and drops it for
    BODY_LINGER_S (10 s) and closes the connection if it cannot. A hold as long (here 10 s, the
    second held connection) would stop that reading until then, and the connection be closed."""
    url = small_budget.url
    infer = "/v2/models/affine/infer"
    declared = head(infer, {"Content-Type": "application/json", "Content-Length": DECLARED})

    async def scenario():
        _, hog = await stalled_upload(url, DECLARED, path=infer, headers={"Content-Type": "application/json"})
        _, first = await open_raw(url)  # a first held connection, so the next one's hold is longer
        first.write(declared)
        await wait_for(lambda: metric(url, "aclserve_connections_held") == 1)
        reader, writer = await open_raw(url)
        writer.write(declared)
        status, answer = await read_response(reader)
        writer.write(b" " * DECLARED)  # the refused body, after its answer
        await writer.drain()
        hog.close()
        await wait_for(lambda: metric(url, "aclserve_request_memory_bytes") == 0)
        writer.write(request(ONE_ROW))  # the same connection, once its hold is over
        status_after, _ = await read_response(reader)
        for w in (first, writer):
            w.close()
        return status, answer, status_after

    status, answer, status_after = asyncio.run(scenario())
    assert status == 503 and b"\r\nRetry-After: %d\r\n" % PENDING_BODY_HOLD_S in answer
    assert status_after == 200


HEALTH = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n"


async def overload(url: str):
    """Fill the queue, then have a request refused through aiohttp, which turns the guard's
    checks of request heads on: (the queued request's reader, the writers to close)."""
    waiting_reader, waiting = await fill_queue(url)
    _, first_writer = await refused_through_aiohttp(url)
    return waiting_reader, [waiting, first_writer]


def failures(url: str) -> tuple[int, int]:
    """affine's statistics' `fail`: (count, ns)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/affine/stats", timeout=30) as answer:
        fail = json.loads(answer.read())["model_stats"][0]["inference_stats"]["fail"]
    return fail["count"], fail["ns"]


def test_a_plain_request_for_a_full_queue_is_refused_before_aiohttp_parses_it(one_slot):
    """Once a refusal has shown the server overloaded, request heads are checked as they come."""
    url = one_slot.url

    async def scenario():
        waiting_reader, writers = await overload(url)
        assert metric(url, "aclserve_early_refusals_total") == 0
        failed_before = failures(url)
        reader, writer = await open_raw(url)
        writer.write(request(ONE_ROW))
        refused = await read_response(reader)
        early = metric(url, "aclserve_early_refusals_total")
        # its time in the statistics' `fail`: the guard's check (it added 0 ns: a tester, t83)
        count, ns = (now - then for now, then in zip(failures(url), failed_before))
        assert count == 1 and ns > 0
        held = metric(url, "aclserve_connections_held")
        # a request naming a priority is read by the codec: level 1 has room (answered 200)
        await release(url)
        first = await read_response(waiting_reader)
        for w in (*writers, writer):
            w.close()
        return refused, early, held, first

    (status, answer), early, held, (first_status, _) = asyncio.run(scenario())
    assert status == 503 and b"the queue is full" in answer and b"\r\nRetry-After: 1\r\n" in answer
    assert early == 1 and held == 2  # refused by the guard, and held like the first refusal
    assert first_status == 200
    assert metric(url, "aclserve_request_failure_total", 'model="affine",reason="QueueFull",version="1"') == 2
    assert metric(url, "aclserve_early_refusals_total") == 1


def test_answers_keep_their_order_behind_a_request_aiohttp_is_answering(one_slot):
    """Pipelined: a request behind one handed to aiohttp is handed to aiohttp too, so its
    refusal cannot overtake the answer before it."""
    url = one_slot.url

    async def scenario():
        waiting_reader, writers = await overload(url)
        reader, writer = await open_raw(url)
        writer.write(HEALTH + request(ONE_ROW))
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 2:
            chunk = await asyncio.wait_for(reader.read(65536), 30)
            assert chunk, "the server closed the connection"
            answers += chunk
        await release(url)
        await read_response(waiting_reader)
        for w in (*writers, writer):
            w.close()
        return answers

    answers = asyncio.run(scenario())
    assert answers.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 503 " in answers[20:]
    assert metric(url, "aclserve_early_refusals_total") == 0  # aiohttp answered both


@pytest.fixture
def no_early_refusals(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config, shed_before_parsing=False) as srv:
        yield srv


def test_with_shed_before_parsing_off_aiohttp_refuses_every_request(no_early_refusals):
    url = no_early_refusals.url

    async def scenario():
        waiting_reader, waiting = await fill_queue(url)
        reader, writer = await open_raw(url)
        writer.write(request(ONE_ROW))
        refused = await read_response(reader)
        await release(url)
        await read_response(waiting_reader)
        for w in (waiting, writer):
            w.close()
        return refused

    status, answer = asyncio.run(scenario())
    assert status == 503 and b"queue is full" in answer
    assert metric(url, "aclserve_early_refusals_total") == 0


def test_by_default_a_refused_connection_is_read_again_at_once(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config) as srv:
        status, _, held_now, status_after, _, first_status = asyncio.run(refuse_then_send_again(srv.url))
        assert status == 503 and held_now == 0
        assert status_after == 503  # read at once, and the queue was still full
        assert first_status == 200
        assert metric(srv.url, "aclserve_connection_holds_total") == 0
        assert metric(srv.url, "aclserve_early_refusals_total") == 1  # the second: the first showed overload
