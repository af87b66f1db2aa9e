"""How requests share the decode threads, through the real app on the test's loop with a float
model built here: pictures taken in turn by their requests, a request's pictures not started
dropped when it ends, its wait for a thread counted by its queue deadline, and a JPEG whose
pixels x scans pass images.max_scan_pixels refused before it decodes. Found by tester t88: a
request of 32 progressive JPEGs of 64 scans held both threads ~100 s, and a one-picture request
sent a second later got nothing in 60 s. The decoder is held by permits where a test needs
pictures to stay in their decodes."""
from __future__ import annotations

import asyncio
import base64
import threading

import aiohttp
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.images.images_data import encode, gradient
from tests.serving import server_config, started_app, until
from tests.tiny_models import compile_cpu_om, save_graph

PIC_A = encode(np.full((8, 8, 3), 200, np.uint8))
PIC_B = encode(np.full((9, 9, 3), 50, np.uint8))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """means: FP32 [N, 3, 16, 16] pictures -> their per-channel means, gears 4 and 8 only; a queue
    deadline of 2 s, and a batch window long enough that 3 rows wait in the queue for a 4th (a
    request of 4 or 8 fills a gear and runs at once)."""
    root, src = tmp_path_factory.mktemp("decode_turns_models"), tmp_path_factory.mktemp("decode_turns_src")
    vi = helper.make_tensor_value_info
    means = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph([means], "means", [vi("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [vi("y", TensorProto.FLOAT, ["N", 3])])
    compile_cpu_om(save_graph(graph, src / "means.onnx"), root / "means.om", batch="4,8")
    (root / "means.yaml").write_text("inputs:\n  x:\n    image: {mean: [120], std: [60]}\n"
                                     "batching: {max_queue_delay_ms: 600000, default_queue_policy: "
                                     "{default_timeout_ms: 2000}}\n")
    return root


class _PermittedDecoder:
    """The server's decoder, recording the pictures it is given in order; while `held`, each
    call waits for a permit."""

    def __init__(self, images, held: bool = True):
        self.decode, self.given = images.decode, []
        self.permits, self.held = threading.Semaphore(0), held
        images.decode = self

    def __call__(self, data, plan):
        self.given.append(bytes(data))
        if self.held:
            self.permits.acquire(timeout=60)
        return self.decode(data, plan)

    def release_all(self) -> None:
        self.held = False
        for _ in range(64):
            self.permits.release()


def _body(pictures: list[bytes], **parameters) -> dict:
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [len(pictures)],
                        "data": [base64.b64encode(p).decode() for p in pictures]}]}
    if parameters:
        body["parameters"] = parameters
    return body


async def _post(session, url: str, pictures: list[bytes], **parameters):
    async with session.post(f"{url}/v2/models/means/infer", json=_body(pictures, **parameters)) as response:
        return response.status, dict(response.headers), await response.json()


def _scenario(models, test, **images):
    config = server_config(models, images={"workers": 2, **images})

    async def run():
        runner, state, url, _, _ = await started_app(config)
        try:
            async with aiohttp.ClientSession() as session:
                await test(session, url, state)
        finally:
            decoder = state.images.decode
            if isinstance(decoder, _PermittedDecoder):
                decoder.release_all()
            await runner.cleanup()
    asyncio.run(run())


def test_a_request_takes_the_next_free_thread_not_the_turn_after_another_requests_pictures(models):
    """Two threads decoding the first 2 of a request's 8 pictures: a request sent then is given
    the next thread free for its first picture (FIFO order gave it the 9th)."""
    async def test(session, url, state):
        decoder = _PermittedDecoder(state.images)
        many = asyncio.create_task(_post(session, url, [PIC_A] * 8))
        await until(lambda: len(decoder.given) == 2)
        other = asyncio.create_task(_post(session, url, [PIC_B] * 4))
        await until(lambda: state.images.pool.pending == 12)
        decoder.permits.release()  # one of the two decodes ends: its thread takes the next picture
        await until(lambda: len(decoder.given) == 3)
        assert decoder.given[2] == PIC_B, "the request sent second waited behind the first one's pictures"
        decoder.release_all()
        for status, _, out in await asyncio.gather(many, other):
            assert status == 200, out
    _scenario(models, test)


def test_a_request_that_ends_drops_its_pictures_not_started(models):
    """A picture refused (row 1 of 4, one thread): the rows after it are not decoded, and the 400
    names row 1; a client gone while its first picture decodes: its 3 others are dropped at once
    (the pool holds only the one decoding), never decoded."""
    async def test(session, url, state):
        decoder = _PermittedDecoder(state.images, held=False)
        status, _, out = await _post(session, url, [PIC_A, b"not a picture", PIC_A, PIC_A])
        assert status == 400 and out["error"] == "input 'x' row 1: not a JPEG or PNG image", out
        assert len(decoder.given) == 2, "the rows after the refused one were decoded"
        await until(lambda: state.images.pool.pending == 0)

        decoder.given.clear()
        decoder.held = True
        gone = asyncio.create_task(_post(session, url, [PIC_A] * 4))
        await until(lambda: len(decoder.given) == 1)
        gone.cancel()  # closes its connection: the request ends
        await asyncio.gather(gone, return_exceptions=True)
        await until(lambda: state.infer_requests.count == 0)
        assert state.images.pool.pending == 1  # the one decoding runs on
        decoder.release_all()
        await until(lambda: state.images.pool.pending == 0)
        assert len(decoder.given) == 1
    _scenario(models, test, workers=1)


def test_the_wait_for_a_decode_thread_counts_against_the_queue_deadline(models):
    """One thread held by a request's first picture: a request whose own timeout (100 ms) passes
    while it waits for it is answered 503 with Retry-After, its picture never decoded (it waited
    as long as the thread was held); one taken in time is queued with what its deadline (the
    level's 2 s) has left, and its timeout says what it waited for a thread."""
    async def test(session, url, state):
        decoder = _PermittedDecoder(state.images)
        holding = asyncio.create_task(_post(session, url, [PIC_A] * 4))
        await until(lambda: len(decoder.given) == 1)
        status, headers, out = await asyncio.wait_for(_post(session, url, [PIC_B], timeout=100_000), 60)
        assert status == 503 and headers.get("Retry-After"), out
        assert out["error"].startswith("request timed out after ") and "waiting for a decode thread" in out["error"]
        assert decoder.given == [PIC_A] and state.images.pool.pending == 4

        waits = asyncio.create_task(_post(session, url, [PIC_B] * 3))  # 3 rows: they wait for a 4th
        await until(lambda: state.images.pool.pending == 7)
        for _ in range(6):  # the 4 of the first and 2 of these (in turns): the first runs alone
            decoder.permits.release()
        status, _, out = await holding
        assert status == 200, out
        decoder.release_all()
        status, headers, out = await asyncio.wait_for(waits, 60)
        assert status == 503 and headers.get("Retry-After"), out
        assert " in the queue (and " in out["error"] and " ms for a decode thread before it)" in out["error"], out
    _scenario(models, test, workers=1)


def test_a_jpeg_whose_pixels_times_scans_pass_the_bound_is_refused_before_it_decodes(models):
    """200 x 200 progressive: grey in 6 scans (240,000 pixels x scans) decodes, RGB in 10
    (400,000) is refused naming its figures and the limit, and so is the request it is in, its
    other pictures not decoded; a baseline one (one scan: 40,000) decodes."""
    async def test(session, url, state):
        decoder = _PermittedDecoder(state.images, held=False)
        grey = encode(gradient(200, 200, 1), "JPEG", progressive=True)
        rgb = encode(gradient(200, 200), "JPEG", progressive=True)
        baseline = encode(gradient(200, 200), "JPEG")
        status, _, out = await _post(session, url, [grey, baseline] * 2)
        assert status == 200, out
        status, headers, out = await _post(session, url, [rgb, baseline, baseline, baseline])
        assert status == 400 and not headers.get("Retry-After"), out
        assert out["error"] == ("input 'x' row 0: JPEG of 200x200 pixels in 10 scans is 400,000 pixels x scans to "
                                "decode; the limit is 300,000 (images.max_scan_pixels: each scan is a pass over the "
                                "whole picture; a progressive JPEG has about 10)"), out
        assert len(decoder.given) == 5  # the first request's four, then the refused one alone
    _scenario(models, test, workers=1, max_scan_pixels=300_000)
