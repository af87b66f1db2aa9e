"""Request memory is bounded by the configuration: the budget, the size limits, inflating in
steps, and the memory given back. Sizes are small (a 4 MiB budget) so the tests are fast; the
full-size attack (16 gzip bombs of 1 GB, 16 x 40 MB JSON) is tools/attack_server.py."""
from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import re
import zlib

import aiohttp
import numpy as np
import pytest

from aclserve.errors import PayloadTooLarge
from aclserve.server.budget import MemoryBudget, MemoryExhausted, json_tensor_estimate
from aclserve.server.http_errors import http_status, retry_after

from tests.serving import ServerThread

from .hostile import closed_by_server, head, lingering, metric, open_raw, read_response, stalled_upload, wait_for

MiB = 1 << 20
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def gzip_of_zeros(nbytes: int) -> bytes:
    enc = zlib.compressobj(9, zlib.DEFLATED, 31)
    return enc.compress(bytes(nbytes)) + enc.flush()


def test_budget_charges_refuses_and_gives_back():
    released = []
    budget = MemoryBudget(max_inflight_bytes=100, max_request_bytes=60,
                          on_release=lambda held, in_use: released.append((held, in_use)))
    a, b = budget.lease(), budget.lease()
    a.take(50, "body")
    with pytest.raises(MemoryExhausted) as busy:
        b.take(60, "body")  # fits one request's limit, not what is left of the budget
    assert http_status(busy.value) == 503 and retry_after(busy.value) and "max_inflight_bytes" in busy.value.message
    with pytest.raises(PayloadTooLarge, match="max_request_bytes"):
        a.take(11, "decoding")  # 61 > 60 for this request alone
    assert budget.used == 50 and budget.refused == {413: 1, 503: 1}
    with pytest.raises(MemoryExhausted):
        b.check(60, "declared body")  # refused as take would, charging nothing
    b.check(50, "declared body")
    assert budget.used == 50 and b.held == 0 and budget.refused == {413: 1, 503: 2}
    a.drop(20)
    a.release()
    a.release()
    assert budget.used == 0 and released == [(30, 0)] and budget.peak == 50
    assert json_tensor_estimate(1000, 10) == 1000 + 10 * 64 < json_tensor_estimate(1000)


def small_config(models_dir, make_config):
    # max_json_bytes as max_body_bytes: bodies all JSON are not refused from their length first
    # (no inflate ratio: these bombs stop at the body limit; the ratio's own test is below)
    return make_config(models_dir, max_body_bytes=4 * MiB, max_request_bytes=3 * MiB + MiB // 2,
                       max_json_bytes=4 * MiB, max_inflight_bytes=4 * MiB, body_timeout_s=1.0, max_inflate_ratio=0)


@pytest.fixture(scope="module")
def small(models_dir, make_config):
    with ServerThread(small_config(models_dir, make_config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_closing_soon(models_dir, make_config):
    """`small` closing a connection 1 s after it refused or ended a body still to come, not 10 s
    (each test waited that long for the close it checks); its clients send no rest to read."""
    with lingering(1.0), ServerThread(small_config(models_dir, make_config)) as srv:
        yield srv


async def post(url: str, body, headers: dict | None = None, path="/v2/models/double/infer"):
    if isinstance(body, bytes):
        body = io.BytesIO(body)  # streamed: aiohttp warns that a large bytes body blocks the loop
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{url}{path}", data=body, headers=headers or {}) as resp:
            return resp.status, dict(resp.headers), await resp.json()


def test_gzip_bomb_stops_at_the_body_limit_while_inflating(small):
    bomb = gzip_of_zeros(64 * MiB)  # about 64 KB that inflate to 64 MiB
    status, _, doc = asyncio.run(post(small.url, bomb, {"Content-Encoding": "gzip"}))
    assert status == 413 and ("max_body_bytes" in doc["error"] or "max_request_bytes" in doc["error"])
    # inflating stopped one step past the 4 MiB limit: the request never held more than that
    assert metric(small.url, "aclserve_request_memory_peak_bytes") <= 4 * MiB + 2 * MiB
    assert metric(small.url, "aclserve_request_memory_bytes") == 0


def test_metrics_show_the_request_memory_limit_the_config_sets(small):
    """aclserve_request_memory_limit_bytes, what the in-use and peak figures are read against, is
    max_inflight_bytes (4 MiB here; the default is 512 MiB)."""
    assert metric(small.url, "aclserve_request_memory_limit_bytes") == 4 * MiB


def test_a_body_inflating_past_the_ratio_stops_after_the_grace(models_dir, make_config):
    """64 gzip bombs of 1 MB (1 GB each) took the loop 0.2 s each, up to max_body_bytes (64 MiB)
    of inflating before their 413, and new connections waited 6-9 s (an attacker's re-test): a
    body past max_inflate_ratio (100) times its compressed size stops once past INFLATE_GRACE.
    Bodies of an ordinary ratio, and small ones of any, are read whole and judged on content."""
    from aclserve.server.body import INFLATE_GRACE, INFLATE_STEP
    rng = np.random.default_rng(0)
    # the default body limit and ratio (64 MiB, 100), and JSON bodies as large (these are JSON)
    with ServerThread(make_config(models_dir, max_body_bytes=64 * MiB, max_json_bytes=64 * MiB,
                                  max_request_bytes=256 * MiB)) as srv:
        status, _, doc = asyncio.run(post(srv.url, gzip_of_zeros(64 * MiB), {"Content-Encoding": "gzip"}))
        assert status == 413 and re.fullmatch(
            r"request body inflates to more than 100 times the compressed bytes read so far \([\d,]+ from [\d,]+; "
            r"Content-Encoding: gzip; max_inflate_ratio\): send it uncompressed", doc["error"]), doc
        assert metric(srv.url, "aclserve_request_memory_peak_bytes") <= INFLATE_GRACE + 2 * INFLATE_STEP
        digits = rng.integers(0, 10, 8 * MiB, dtype=np.uint8) + ord("0")  # about 2.4 times: text
        for body in (gzip_of_zeros(INFLATE_GRACE - MiB), zlib.compress(digits.tobytes())):
            encoding = "gzip" if body[:2] == b"\x1f\x8b" else "deflate"
            status, _, doc = asyncio.run(post(srv.url, body, {"Content-Encoding": encoding}))
            assert status == 400 and "not valid JSON" in doc["error"], doc  # read whole: its content refused
        assert metric(srv.url, "aclserve_request_memory_peak_bytes") >= 8 * MiB
        compressed = zlib.compress(GOOD)
        assert asyncio.run(post(srv.url, compressed, {"Content-Encoding": "deflate"}))[0] == 200


def test_a_body_of_many_gzip_members_is_refused_and_a_few_are_inflated(small):
    """Thousands of empty gzip members cost the loop a decompressor each (seconds for a few MB,
    nothing inflated for the body limit to count): more than 64 are a 400. A few members, as a
    client concatenating its parts sends, are one body."""
    import gzip
    import json
    status, _, doc = asyncio.run(post(small.url, gzip.compress(b"") * 1000, {"Content-Encoding": "gzip"}))
    assert status == 400 and "more than 64 gzip members" in doc["error"]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}).encode()
    parts = [gzip.compress(body[k:k + 20]) for k in range(0, len(body), 20)]
    assert len(parts) < 64
    status, _, doc = asyncio.run(post(small.url, b"".join(parts), {"Content-Encoding": "gzip"}))
    assert status == 200, doc


def test_concurrent_bombs_and_big_json_are_refused_and_others_served(small):
    """The bombs and the large JSON bodies hold the budget with what they have received and
    inflated, never more than it; a small request refused (503) meanwhile is served once it
    retries after its Retry-After, as the refusal asks."""
    bomb = gzip_of_zeros(16 * MiB)
    big_json = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[16384,16],"data":[' + b"0.5," * 262143 + b"0.5]}]}"

    async def retried(body):
        for _ in range(30):  # (a hang guard: the flood is over within a few retries)
            status, headers, doc = await post(small.url, body)
            if status != 503:
                return status, headers, doc
            await asyncio.sleep(int(headers["Retry-After"]))
        return status, headers, doc

    async def scenario():
        bombs = [post(small.url, bomb, {"Content-Encoding": "gzip"}) for _ in range(16)]
        jsons = [post(small.url, big_json) for _ in range(8)]
        good = [retried(GOOD) for _ in range(4)]
        return await asyncio.gather(*bombs, *jsons, *good)
    results = asyncio.run(scenario())
    assert all(status in (413, 503) for status, _, _ in results[:24])
    assert all(status == 200 for status, _, _ in results[24:])
    assert metric(small.url, "aclserve_request_memory_peak_bytes") <= 4 * MiB


def test_a_request_that_would_pass_the_budget_waits_outside_it(small):
    """An upload stalled after 3 MiB holds them of the 4 MiB budget: a 2 MiB request gets 503 +
    Retry-After before its body is read, a small one is served; once the upload is gone the same
    2 MiB request gets past the budget (and is then judged on its content)."""
    big = np.zeros((32768, 16), np.float32)
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(big.shape),
                                     "parameters": {"binary_data_size": big.nbytes}}]}).encode()
    binary = (header + big.tobytes(), {"Inference-Header-Content-Length": str(len(header))})

    async def scenario():
        _, writer = await stalled_upload(small.url, 3 * MiB)
        refused = await post(small.url, *binary)
        served = await post(small.url, GOOD)
        writer.close()
        await wait_for(lambda: metric(small.url, "aclserve_request_memory_bytes") == 0)
        judged = await post(small.url, *binary)
        return refused, served, judged
    refused, served, judged = asyncio.run(scenario())
    assert refused[0] == 503 and "Retry-After" in refused[1] and "max_inflight_bytes" in refused[2]["error"]
    assert served[0] == 200
    assert judged[0] == 400 and "max_batch_size" in judged[2]["error"]


def test_json_that_would_decode_past_the_request_limit_is_413_before_decoding(small):
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":[' + b"0.5," * 200_000 + b"0.5]}]}"
    status, _, doc = asyncio.run(post(small.url, body))
    assert status == 413 and "max_request_bytes" in doc["error"] and "binary tensor extension" in doc["error"]


def test_json_whose_text_is_long_for_its_values_is_charged_what_its_values_can_take(small):
    """16 numbers written with 20,000 digits each: 320 KB of text, charged as 160,000 values
    (one per 2 bytes: 10 MiB, over max_request_bytes, so 413) before; counted from the text's
    separators when that would not fit, it is 16 values and is served."""
    digits = "0." + "3" * 20_000
    body = ('{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":[' + ",".join([digits] * 16)
            + "]}]}").encode()
    status, _, doc = asyncio.run(post(small.url, body))
    assert status == 200, doc
    assert np.allclose(doc["outputs"][0]["data"], [2 / 3] * 16)


def test_declared_length_over_the_limit_is_refused_before_the_body_is_sent(small):
    async def scenario():
        reader, writer = await open_raw(small.url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": 100 * MiB}))
        status, answer = await read_response(reader)  # no body byte was sent
        writer.close()
        return status, answer
    status, answer = asyncio.run(scenario())
    assert status == 413 and b"max_body_bytes" in answer


def test_expect_100_continue_is_answered_after_the_size_and_budget_checks(small_closing_soon):
    """A client that asks before sending its body is told 413 / 503 instead of 100 Continue
    when the body could not be taken, and 100 Continue when it could."""
    async def ask(length: int):
        reader, writer = await open_raw(small_closing_soon.url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": length, "Expect": "100-continue"}))
        status, answer = await read_response(reader)  # no body byte was sent
        return reader, writer, status, answer

    async def scenario():
        *_, writer, over_status, over = await ask(100 * MiB)
        closed = await closed_by_server(_[0])
        writer.close()
        _, stall = await stalled_upload(small_closing_soon.url, 3 * MiB)
        *_, busy_writer, busy_status, busy = await ask(2 * MiB)
        busy_writer.close()
        stall.close()
        await wait_for(lambda: metric(small_closing_soon.url, "aclserve_request_memory_bytes") == 0)
        reader, writer, go_status, _ = await ask(len(GOOD))
        writer.write(GOOD)
        served_status, served = await read_response(reader)
        writer.close()
        return over_status, over, closed, busy_status, busy, go_status, served_status, served
    over_status, over, closed, busy_status, busy, go_status, served_status, served = asyncio.run(scenario())
    assert over_status == 413 and b"max_body_bytes" in over and closed
    assert busy_status == 503 and b"max_inflight_bytes" in busy and b"Retry-After" in busy
    assert go_status == 100 and served_status == 200 and b'"outputs"' in served


def test_a_request_refused_at_its_expect_is_counted_and_an_unknown_model_is_404_first(small):
    """Answered in the expect handler, a refusal reached neither the statistics nor /metrics nor
    the request log, and an unknown model got 413 for its size where without Expect it got 404."""
    async def ask(model: str):
        reader, writer = await open_raw(small.url)
        writer.write(head(f"/v2/models/{model}/infer", {"Content-Length": 100 * MiB, "Expect": "100-continue"}))
        status, answer = await read_response(reader)
        writer.close()
        return status, answer
    labels = 'model="double",reason="PayloadTooLarge",version="1"'
    before = metric(small.url, "aclserve_request_failure_total", labels)
    status, answer = asyncio.run(ask("double"))
    assert status == 413 and b"max_body_bytes" in answer
    assert metric(small.url, "aclserve_request_failure_total", labels) == before + 1
    status, answer = asyncio.run(ask("nosuchmodel"))
    assert status == 404 and b"unknown model" in answer, answer


def test_chunked_body_over_the_limit_is_413(small):
    async def chunks():
        for _ in range(6):
            yield bytes(MiB)
    status, _, doc = asyncio.run(post(small.url, chunks()))
    assert status == 413 and ("max_body_bytes" in doc["error"] or "max_request_bytes" in doc["error"])


@pytest.mark.parametrize("wbits", [15, -15], ids=["zlib-wrapped", "raw"])
def test_deflate_bodies_of_both_kinds_are_served(small, wbits):
    enc = zlib.compressobj(6, zlib.DEFLATED, wbits)
    status, _, doc = asyncio.run(post(small.url, enc.compress(GOOD) + enc.flush(), {"Content-Encoding": "deflate"}))
    assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 16


def test_multi_member_gzip_is_served(small):
    half = len(GOOD) // 2
    body = b"".join(_gzip(part) for part in (GOOD[:half], GOOD[half:]))
    status, _, doc = asyncio.run(post(small.url, body, {"Content-Encoding": "gzip"}))
    assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 16


def _gzip(data: bytes) -> bytes:
    enc = zlib.compressobj(6, zlib.DEFLATED, 31)
    return enc.compress(data) + enc.flush()


@pytest.mark.parametrize("body, encoding, code, fragment", [
    (_gzip(GOOD)[:-12], "gzip", 400, "ends before its gzip stream"),
    (_gzip(GOOD), "br", 415, "Content-Encoding 'br' is not supported"),
    (zlib.compress(GOOD) + b"junk", "deflate", 400, "data after the end"),
])
def test_bad_encodings_get_a_4xx_naming_the_problem(small, body, encoding, code, fragment):
    status, _, doc = asyncio.run(post(small.url, body, {"Content-Encoding": encoding}))
    assert status == code and fragment in doc["error"]


def test_a_stalled_body_gets_408_and_its_connection_closed(small_closing_soon):
    async def scenario():
        reader, writer = await open_raw(small_closing_soon.url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": 1000}) + b'{"inputs"')
        status, answer = await read_response(reader)
        closed = await closed_by_server(reader)
        writer.close()
        return status, answer, closed
    status, answer, closed = asyncio.run(scenario())
    assert status == 408 and b"body_timeout_s" in answer and closed


def test_memory_is_given_back_after_large_requests(models_dir, make_config):
    """Requests that held >= 8 MiB trigger malloc_trim (glibc) once they end."""
    from aclserve.server.trim import HeapTrimmer
    if not HeapTrimmer().available:
        pytest.skip("malloc_trim needs glibc")
    srv = ServerThread(make_config(models_dir, max_body_bytes=32 * MiB, max_json_bytes=32 * MiB,
                                   max_inflate_ratio=0)).start()
    try:
        status, _, doc = asyncio.run(post(srv.url, gzip_of_zeros(16 * MiB), {"Content-Encoding": "gzip"}))
        # zeros are no JSON, found at the first byte once the 16 MiB are inflated and held (each
        # limit is 32 MiB: none refuses them first); the decoder's own words follow the colon
        assert status == 400 and doc["error"].startswith("request body is not valid JSON: "), doc
        assert doc["error"].endswith("line 1 column 1 (char 0)"), doc
        asyncio.run(wait_for(lambda: metric(srv.url, "aclserve_heap_trims_total") >= 1))
        assert metric(srv.url, "aclserve_request_memory_peak_bytes") >= 16 * MiB
    finally:
        srv.close()


def test_memory_is_given_back_after_a_burst_of_small_requests(monkeypatch):
    """3,000 abandoned uploads of 100 KB each left the RSS 300 MB up for good: none held the
    8 MiB that triggered a trim (found by an attacker's re-test). A burst that held BURST_BYTES
    together is trimmed once it has mostly gone; steady load holding less triggers nothing."""
    from aclserve.server import trim
    trims = []
    monkeypatch.setattr(trim.heap, "trim", lambda: trims.append(1))
    monkeypatch.setattr(trim.heap, "available", lambda: True)

    async def scenario():
        loop = asyncio.get_running_loop()
        # the trims run in the loop's default executor: one worker, in order, so that a no-op
        # run there after the releases comes after any trim they started (a sequence point)
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        trimmer = trim.HeapTrimmer(min_interval_s=0)
        budget = MemoryBudget(1 << 40, 1 << 40, on_release=trimmer.released)
        steady = [budget.lease() for _ in range(64)]
        for _ in range(20):  # 64 requests of 100 KB in flight, over and over: no trim
            for lease in steady:
                lease.take(100_000, "body")
            for lease in steady:
                lease.release()
            await asyncio.sleep(0)
        await loop.run_in_executor(None, lambda: None)
        assert trims == []
        burst = [budget.lease() for _ in range(1000)]  # 100 MB together
        for lease in burst:
            lease.take(100_000, "body")
        for lease in burst[:700]:
            lease.release()
        await loop.run_in_executor(None, lambda: None)
        assert trims == []  # 30 MB still held: not yet
        for lease in burst[700:]:
            lease.release()
        await wait_for(lambda: trims == [1], limit_s=10)
    asyncio.run(scenario())


def test_a_small_chunked_body_over_the_limit_is_413_even_when_already_buffered(models_dir, make_config):
    srv = ServerThread(make_config(models_dir, max_body_bytes=1000)).start()
    try:
        async def scenario():
            reader, writer = await open_raw(srv.url)
            chunk = b"{" + b" " * 4998 + b"}"
            writer.write(head("/v2/models/double/infer", {"Transfer-Encoding": "chunked"})
                         + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))  # the whole body in one write
            status, answer = await read_response(reader)
            writer.close()
            return status, answer
        status, answer = asyncio.run(scenario())
        assert status == 413 and b"max_body_bytes" in answer
    finally:
        srv.close()


def test_a_refused_body_still_arriving_is_read_so_its_client_gets_the_answer(small):
    """A body refused by its declared length is answered at once; a client that sends the body
    anyway (as most do, reading the answer only after) takes 3 s here, as a 5 MiB body does on
    a slow link. The server reads and drops it meanwhile: closing with it unread (the server
    did after 2 s) resets the connection, and the client's send fails before it sees the 413."""
    length, pieces = 5 * MiB, 40

    async def scenario():
        reader, writer = await open_raw(small.url)
        writer.write(head("/v2/models/double/infer", {"Content-Type": "application/json",
                                                        "Content-Length": length}))
        piece = b" " * (length // pieces)
        try:
            for _ in range(pieces):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(3.0 / pieces)
        except ConnectionError as e:
            return "reset while sending", repr(e)
        status, answer = await read_response(reader)
        writer.close()
        return status, answer

    status, answer = asyncio.run(scenario())
    assert status == 413 and b"max_body_bytes" in answer, (status, answer[:200])


def test_what_decoding_was_charged_goes_back_once_decoded(models_dir, tmp_path, make_config):
    """Two 80 KB JSON bodies (an id of 80,000 commas, 48 numbers): each is charged about 2.6 MB
    while it is parsed, and the first waits 0.5 s for company. That charge stayed for the
    request's whole life, so the second found the 4 MiB budget full (503): 64 clients sending
    570 KB JSON images got 503 for 77 % of their requests while the server's memory rose 45 MB.
    Once decoded only the tensors stay charged."""
    import shutil
    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    (tmp_path / "double.yaml").write_text("batching: {max_queue_delay_ms: 500}\n")
    body = ('{"id":"' + "," * 80_000 + '","inputs":[{"name":"x","datatype":"FP32","shape":[3,16],"data":['
            + ",".join(["0.5"] * 48) + "]}]}").encode()  # 3 rows fill no gear: each waits its window
    config = make_config(tmp_path, max_body_bytes=4 * MiB, max_request_bytes=3 * MiB + MiB // 2,
                         max_inflight_bytes=4 * MiB, model_control_mode="none")
    with ServerThread(config) as srv:
        async def both():
            first = asyncio.ensure_future(post(srv.url, body))
            await wait_for(lambda: metric(srv.url, "aclserve_request_memory_bytes") >= len(body))  # queued
            return await asyncio.gather(first, post(srv.url, body))
        answers = asyncio.run(both())
    assert [status for status, _, _ in answers] == [200, 200], answers
