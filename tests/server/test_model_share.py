"""One model's share of the request memory budget (max_inflight_bytes_per_model): while the server
serves more than one model, the requests for one model hold at most its share, so a flood of large
requests for one model leaves room for the others' (a tester's 36 clients of 24 MiB requests to
one model held the whole 512 MiB, and another model's small requests got 503). Each request is
charged to its model from the moment the model is known, on every way in: aiohttp's path, the
guard's direct one, an `Expect: 100-continue` head, a body still arriving, gRPC unary and streamed.
A real server on real ports; "slow" holds its requests (and their charges) until 8 rows are
queued, so a test decides when they end."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import urllib.request

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.server.body import timeout_at
from aclserve.server.budget import MemoryBudget, MemoryExhausted
from aclserve.server.stalled_bodies import STALL_S, Arrival, StalledBodies
from tests.serving import ServerThread, free_port, server_config, started_with_grpc

from .grpc_raw import INFER, STREAM, affine
from .hostile import head, metric, open_raw, read_response, stalled_upload, wait_for
from .test_grpc_guards import with_slow

MiB, KiB = 1 << 20, 1 << 10
SHARE = 3 * MiB  # auto: three quarters of the 4 MiB budget
REFUSED = re.compile(r"model slow holds [\d.]+ MiB of its 3\.0 MiB share of request memory "
                     r"\(max_inflight_bytes_per_model\); retry later")


def test_the_budget_keeps_each_models_bytes_and_refuses_past_a_share_while_others_are_served():
    """Per-model bytes through every way a lease moves them, entries gone at 0; the share applies
    only while more than one model is served, and its refusal names the model and its share."""
    served, refused = [2], []
    budget = MemoryBudget(100, 40, on_refused=lambda lease, *shortfalls: refused.append(shortfalls),
                          models_served=lambda: served[0])
    assert budget.share == 75 and budget.share_now() == 75  # three quarters of 100, over max_request_bytes' 40
    a, b, other, control = budget.lease(model="a"), budget.lease(model="a"), budget.lease(model="b"), budget.lease()
    a.take(40, "body")
    b.take(30, "body")
    control.take(5, "body")  # no model's: the budget's alone
    with pytest.raises(MemoryExhausted, match=r"^model a holds 0\.0 MiB of its 0\.0 MiB share of request memory "
                                              r"\(max_inflight_bytes_per_model\); retry later$"):
        b.take(10, "decoding")  # 80 > 75 for a
    assert refused == [(-15, "a", 5)] and budget.refused == {413: 0, 503: 1}  # (the budget had room: 85 of 100)
    other.take(20, "body")  # b's room: 95 of 100 in all
    assert budget.by_model == {"a": 70, "b": 20} and budget.used == 95
    served[0] = 1
    assert budget.share_now() == 100 and b.fits(5)  # one model served: the whole budget
    served[0] = 2
    part = a.split(15)  # (an image decode's charge: still a's)
    a.drop(5)
    b.settle(10)  # an answer made: exactly this from now on
    assert budget.by_model == {"a": 45, "b": 20} and budget.used == 70
    other.take_over(part)  # moved between models (kept right)
    assert budget.by_model == {"a": 30, "b": 35}
    unsent = budget.lease(model="b")
    unsent.take(5, "an answer")
    unsent.attribute(None)  # (a connection's unsent answers of two models: neither's share, the budget's)
    assert budget.by_model == {"a": 30, "b": 35} and unsent.model is None and budget.used == 75
    unsent.release()
    grpc_like = budget.lease()
    grpc_like.attribute("c")  # a gRPC message's: its model is known once it has come
    grpc_like.take(1, "its message")
    for lease in (a, b, other, part, grpc_like, control):
        lease.release()
    assert budget.by_model == {} and budget.used == 0


def test_a_share_refusal_short_of_the_budget_too_ends_that_models_bodies_then_the_others():
    """A request for double refused by its share (75 of 100) when the budget is short too: double's
    stalled body is ended, then, for what the budget still lacks, affine's oldest, so that the
    retry fits both. Only double's was ended before, by the share's shortfall, and the retry was
    refused by the budget. Real budget and body reads, stalled by their last byte's time."""
    async def scenario():
        bodies = StalledBodies()
        budget = MemoryBudget(100, 40, on_refused=bodies.make_room, models_served=lambda: 3)
        release, arrivals = asyncio.Event(), {}

        async def body(name: str, model: str, nbytes: int, stalled: bool = True):
            with budget.lease(model=model) as lease:
                lease.take(nbytes, "request body")
                with contextlib.suppress(asyncio.TimeoutError):  # (body.read_body's: 408)
                    async with timeout_at(asyncio.get_running_loop().time() + 3600) as deadline:
                        with Arrival(bodies, lease, deadline) as arrival:
                            arrivals[name] = arrival
                            if stalled:
                                arrival.last -= STALL_S
                            await release.wait()
        reads = {each[0]: asyncio.ensure_future(body(*each)) for each in (
            ("affine 1", "affine", 15), ("double 1", "double", 5), ("affine 2", "affine", 15),
            ("double arriving", "double", 25, False), ("double arriving too", "double", 25, False))}
        await wait_for(lambda: len(arrivals) == 5)
        refused = budget.lease(model="double")
        with pytest.raises(MemoryExhausted, match="^model double holds"):  # 80 of its 75, 110 of 100
            refused.check(25, "request body")
        ended = sorted(name for name, arrival in arrivals.items() if arrival.ended)
        await asyncio.gather(*(reads[name] for name in ended))  # their charges gone with them
        retry_fits = refused.fits(25)
        release.set()
        await asyncio.gather(*reads.values())
        return ended, retry_fits, budget.used
    ended, retry_fits, used = asyncio.run(scenario())
    assert ended == ["affine 1", "double 1"] and retry_fits and used == 0


@pytest.fixture(scope="module")
def shared(models_dir, tmp_path_factory):
    """A 4 MiB budget (a model's share 3 MiB), 1 MiB a request and a gRPC message, three models."""
    root = with_slow(models_dir, tmp_path_factory.mktemp("model_share"))
    yield from started_with_grpc(server_config(
        root, grpc_port=free_port(), model_control_mode="none", max_inflight_bytes=4 * MiB,
        max_request_bytes=MiB, max_body_bytes=MiB, grpc_max_message_bytes=MiB))


def in_use(srv) -> float:
    return metric(srv.url, "aclserve_request_memory_bytes")


def samples(srv, family: str) -> dict[str, float]:
    """A family's samples in /metrics: labels text -> value."""
    text = urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{family}(\{{.*?\}})? (\S+)$", text, re.M)}


def accepted(srv, model: str) -> float:
    """Requests `model`'s queue took (each charged whole by then)."""
    return sum(value for labels, value in samples(srv, "aclserve_queue_outcomes_total").items()
               if f'model="{model}"' in labels and 'outcome="accepted"' in labels)


def by_model(srv) -> dict[str, float]:
    return {re.search(r'model="(.*)"', labels).group(1): value
            for labels, value in samples(srv, "aclserve_request_memory_model_bytes").items()}


def padded_json(length: int) -> bytes:
    """A one-row affine request of `length` bytes (spaces before it: JSON allows them)."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                  {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]}).encode()
    return b" " * (length - len(body)) + body


def sized(rows: int, length: int, model: str = "slow") -> pb.ModelInferRequest:
    """A gRPC request of `rows` rows whose message is `length` bytes (a long id makes it up)."""
    request = affine(rows, model=model)
    request.id = "i" * (length - request.ByteSize() - 4)  # (4: the field's tag and length)
    request.id += "i" * (length - request.ByteSize())
    return request


async def post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    reader, writer = await open_raw(url)
    writer.write(head(path, {"Content-Length": len(body), **(headers or {})}) + body)
    answer = await read_response(reader)
    writer.close()
    return answer


def test_a_model_flooding_with_large_requests_leaves_the_others_room(shared):
    """"slow" holds four gRPC requests coming to 20 KiB under its 3 MiB share. Then each way in
    is refused for it with its share named: the guard's direct path (a 40 KiB body), an
    `Expect: 100-continue` head, aiohttp's (a declared length, and a chunked body refused as it
    arrives), gRPC unary and streamed; while another model's request of 0.9 MiB, which the 4 MiB
    budget has room for, is answered on each transport. Everything held is slow's, and once its
    batch runs nothing is held, by any model."""
    url = shared.url
    refused_before = metric(url, "aclserve_request_memory_refused_total", 'status="503"')
    direct_before = metric(url, "aclserve_direct_infer_total")
    accepted_before = accepted(shared, "slow")

    async def scenario():
        async with grpc.aio.insecure_channel(shared.grpc_url) as channel:
            infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString,
                                        pb.ModelInferResponse.FromString)
            held, charged = [], []
            for rows in (3, 2, 1, 1):  # 7 rows, no gear filled: they wait for 8
                if len(held) < 3:
                    request = sized(rows, 800 * KiB)
                else:  # what the last one cost beyond its message, so that this one ends 20 KiB short
                    overhead = (charged[2] - charged[1]) - held[2][0].ByteSize()
                    request = sized(rows, SHARE - 20 * KiB - charged[2] - overhead)
                held.append((request, asyncio.ensure_future(infer(request))))
                await wait_for(lambda: accepted(shared, "slow") == accepted_before + len(held))
                charged.append(int(in_use(shared)))
            holds = charged[-1]

            direct = await post(url, "/v2/models/slow/infer", padded_json(40 * KiB))
            expect_reader, expect_writer = await open_raw(url)
            expect_writer.write(head("/v2/models/slow/infer", {"Content-Length": MiB // 2,
                                                               "Expect": "100-continue"}))
            expected = await read_response(expect_reader)
            expect_writer.close()
            declared = await post(url, "/v2/models/slow/infer", padded_json(300 * KiB))
            chunked_reader, chunked = await open_raw(url)
            chunked.write(head("/v2/models/slow/infer", {"Transfer-Encoding": "chunked"}))
            chunk = b" " * (64 * KiB)
            chunked.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) * 8 + b"0\r\n\r\n")  # past the share as it comes
            arriving = await read_response(chunked_reader)
            chunked.close()
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)()
            await stream.write(sized(1, MiB // 2))
            streamed = await stream.read()

            other_http = await post(url, "/v2/models/affine/infer", padded_json(450 * KiB))
            other_grpc = await infer(sized(1, 900 * KiB, model="affine"))
            await stream.write(sized(1, 900 * KiB, model="affine"))
            other_streamed = await stream.read()
            await stream.done_writing()
            await wait_for(lambda: in_use(shared) == holds)  # (the other models' answers taken)
            still = by_model(shared)

            fill = await infer(affine(1, model="slow"))  # 8 rows: the held batch runs
            answered = [a.id for a in await asyncio.gather(*[call for _, call in held])] == [r.id for r, _ in held]
            await wait_for(lambda: in_use(shared) == 0)
            return (holds, direct, expected, declared, arriving, streamed, other_http, other_grpc,
                    other_streamed, still, fill, answered)

    (holds, direct, expected, declared, arriving, streamed, other_http, other_grpc, other_streamed, still,
     fill, answered) = asyncio.run(scenario())
    assert SHARE - 40 * KiB < holds <= SHARE - 10 * KiB
    for status, answer in (direct, expected, declared, arriving):
        assert status == 503 and b"\r\nRetry-After: " in answer and REFUSED.search(answer.decode()), answer[:400]
    assert b"\r\nConnection: close\r\n" in arriving[1]  # refused as it arrived: the rest of it not read
    assert metric(url, "aclserve_direct_infer_total") > direct_before  # the guard's own path
    assert REFUSED.search(streamed.error_message), streamed.error_message
    assert other_http[0] == 200 and b'"outputs"' in other_http[1], other_http[1][:300]
    assert len(other_grpc.raw_output_contents) == 2
    assert not other_streamed.error_message and other_streamed.infer_response.model_name == "affine"
    assert still == {"slow": holds}  # every byte held is slow's, charged as its model's
    assert len(fill.raw_output_contents) == 2 and answered  # (the held requests, each its own answer)
    assert metric(url, "aclserve_request_memory_refused_total", 'status="503"') == refused_before + 5
    assert by_model(shared) == {}  # (no model's entry left at 0)


def test_a_refused_grpc_call_names_the_models_share(shared):
    """A unary call past slow's share ends UNAVAILABLE with a retry pushback, naming the share."""
    before = accepted(shared, "slow")

    async def scenario():
        async with grpc.aio.insecure_channel(shared.grpc_url) as channel:
            infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString,
                                        pb.ModelInferResponse.FromString)
            held = []
            for rows in (3, 2, 1):  # one by one: 6 rows, no gear filled
                held.append(asyncio.ensure_future(infer(sized(rows, MiB - 16 * KiB))))
                await wait_for(lambda: accepted(shared, "slow") == before + len(held))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(sized(1, MiB // 2))
            fill = await infer(affine(2, model="slow"))
            await asyncio.gather(*held)
            await wait_for(lambda: in_use(shared) == 0)
            return refused.value, fill
    refusal, fill = asyncio.run(scenario())
    assert refusal.code() == grpc.StatusCode.UNAVAILABLE and REFUSED.search(refusal.details()), refusal
    assert dict(refusal.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert len(fill.raw_output_contents) == 2 and by_model(shared) == {}


def test_one_model_served_may_use_the_whole_budget_and_a_body_timed_out_gives_its_charge_back(double_dir):
    """With double alone served, four uploads of 0.9 MiB hold 3.6 MiB of the 4 MiB budget, past
    what a share would be (3 MiB); each times out (408) and its model's charge goes with it."""
    config = server_config(double_dir, model_control_mode="none", max_inflight_bytes=4 * MiB,
                           max_request_bytes=MiB, max_body_bytes=MiB, max_json_bytes=MiB, body_timeout_s=5)
    with ServerThread(config) as srv:
        async def scenario():
            uploads = [await stalled_upload(srv.url, 900 * KiB) for _ in range(4)]
            held = in_use(srv), metric(srv.url, "aclserve_request_memory_model_share_bytes"), by_model(srv)
            answers = [await read_response(reader) for reader, _ in uploads]
            for _, writer in uploads:
                writer.close()
            await wait_for(lambda: in_use(srv) == 0)
            return held, answers
        (held, share, models), answers = asyncio.run(scenario())
        assert held >= 4 * (900 * KiB - 1) and share == 4 * MiB and models == {"double": held}
        assert [status for status, _ in answers] == [408] * 4
        assert by_model(srv) == {} and metric(srv.url, "aclserve_request_memory_refused_total", 'status="503"') == 0


def test_a_body_cancelled_midway_gives_its_models_charge_back(shared):
    """A client gone halfway through its body (its handler cancelled): its model holds nothing more."""
    async def scenario():
        _, writer = await stalled_upload(shared.url, 200 * KiB, path="/v2/models/double/infer")
        held = by_model(shared)
        writer.close()
        await wait_for(lambda: in_use(shared) == 0)
        return held
    held = asyncio.run(scenario())
    assert set(held) == {"double"} and held["double"] >= 200 * KiB - 1
    assert by_model(shared) == {}


def test_a_refusal_for_a_models_share_ends_that_models_stalled_bodies_only(shared):
    """Stalled bodies, affine's first, then four of double's filling its share: a request for
    double refused for its share ends double's oldest stalled body (408), not affine's, older but
    holding none of that share; its retry is served, and affine's body, still open, is answered
    once it is whole (400: a body of spaces is no JSON)."""
    double = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
    body = b" " * (300 * KiB - len(double)) + double.encode()

    async def scenario():
        other = await stalled_upload(shared.url, 400 * KiB, path="/v2/models/affine/infer")
        stalled = [await stalled_upload(shared.url, 760 * KiB, path="/v2/models/double/infer") for _ in range(4)]
        await asyncio.sleep(STALL_S + 0.1)  # stalled now, all of them
        refused = await post(shared.url, "/v2/models/double/infer", body)
        ended = await read_response(stalled[0][0])
        await wait_for(lambda: by_model(shared).get("double", 0) <= 3 * 760 * KiB)
        retried = await post(shared.url, "/v2/models/double/infer", body)
        other[1].write(b" ")  # its last byte
        answered = await read_response(other[0])
        for _, writer in (other, *stalled):
            writer.close()
        await wait_for(lambda: in_use(shared) == 0)
        return refused, ended, retried, answered
    (status, refusal), (ended, _), (retried, answer), (answered, _) = asyncio.run(scenario())
    assert status == 503 and re.search(rb"model double holds [\d.]+ MiB of its 3\.0 MiB share", refusal), refusal
    assert ended == 408 and retried == 200 and b'"outputs"' in answer and answered == 400
    assert by_model(shared) == {}
