"""The memory a request's pictures take, charged to its request memory before it is taken: the
input tensors they become (a row of the model input per picture, in its dtype, whatever the
files hold) and what their decodes hold, through the real app on the test's loop with a float
model built here (FP32 [N, 3, 256, 256] -> its per-channel means, [N, 3]). Found by an
independent tester: 32 PNGs of one pixel for a 3x1024x1024 input took 683 MB while 8 MiB were
charged. The decoder is held by an event where a test needs a request to stay in its decodes."""
from __future__ import annotations

import asyncio
import base64
import threading

import aiohttp
import numpy as np
import pytest
from onnx import TensorProto, helper

from aclserve.images.header import probe
from aclserve.images.peak import decode_peak_bytes
from tests.images.images_data import encode
from tests.serving import server_config, started_app, until
from tests.tiny_models import compile_cpu_om, save_graph

SIDE = 256
ROW_BYTES = 3 * SIDE * SIDE * 4  # one picture's row of the FP32 input
PIXEL = encode(np.array([[[200, 10, 10]]], np.uint8))  # one pixel: 69 bytes
MEANS = [(200 - 120) / 60, (10 - 120) / 60, (10 - 120) / 60]  # its row's means, normalised
RTOL = 1e-3  # ONNX Runtime's float32 sum of 65,536 values: 6e-5 off


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root, src = tmp_path_factory.mktemp("image_memory_models"), tmp_path_factory.mktemp("image_memory_src")
    vi = helper.make_tensor_value_info
    means = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph([means], "means", [vi("x", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
                              [vi("y", TensorProto.FLOAT, ["N", 3])])
    compile_cpu_om(save_graph(graph, src / "means.onnx"), root / "means.om", batch="1,2,4,8")
    (root / "means.yaml").write_text("inputs:\n  x:\n    image: {mean: [120], std: [60]}\n"
                                     "batching: {max_queue_delay_ms: 600000}\n")  # 3 rows wait for a 4th
    return root


def _body(pictures: list[bytes]) -> dict:
    return {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [len(pictures)],
                        "data": [base64.b64encode(p).decode() for p in pictures]}]}


async def _post(session, url: str, pictures: list[bytes]):
    async with session.post(f"{url}/v2/models/means/infer", json=_body(pictures)) as response:
        return response.status, dict(response.headers), await response.json()


class _HeldDecoder:
    """The server's decoder, counting its calls; while `held`, each call waits for `release`."""

    def __init__(self, images, held: bool):
        self.decode, self.calls = images.decode, 0
        self.entered, self.release = threading.Event(), threading.Event()
        if not held:
            self.release.set()
        images.decode = self

    def __call__(self, data, plan):
        self.calls += 1
        self.entered.set()
        self.release.wait(60)
        return self.decode(data, plan)


def _decode_charge(state, pictures: int) -> int:
    """What the request's decodes are charged: one picture's peak per decode thread."""
    plan = state.repo.get("means").images.plans["x"]
    return decode_peak_bytes(probe(PIXEL), plan) * min(pictures, state.images.pool.workers)


def test_the_tensors_of_a_requests_pictures_are_charged_while_they_are_held(models):
    """Decoding, a request is charged its 8 rows (6 MiB, against 2 KB of JSON) and its decodes'
    peak, so a second one that cannot fit the server's budget is a 503 before any of its
    pictures decodes; decoded and queued, it still holds its rows' charge; its client gone
    while it decodes, the charge stays until the decodes end."""
    config = server_config(models, images={"workers": 2}, max_request_bytes=10 << 20, max_inflight_bytes=10 << 20)

    async def scenario():
        runner, state, url, _, _ = await started_app(config)
        decoder = _HeldDecoder(state.images, held=True)
        try:
            async with aiohttp.ClientSession() as session:
                first = asyncio.create_task(_post(session, url, [PIXEL] * 8))
                await until(decoder.entered.is_set)
                assert state.budget.used >= 8 * ROW_BYTES + _decode_charge(state, 8)
                status, headers, out = await _post(session, url, [PIXEL] * 8)
                assert status == 503 and headers.get("Retry-After") and "max_inflight_bytes" in out["error"], out
                assert decoder.calls == 2  # the first request's, one per thread
                decoder.release.set()
                status, _, out = await first
                assert status == 200, out
                np.testing.assert_allclose(out["outputs"][0]["data"], MEANS * 8, rtol=RTOL)
                await until(lambda: state.budget.used == 0)

                queued = asyncio.create_task(_post(session, url, [PIXEL] * 3))  # waits for a 4th row
                await until(lambda: state.repo.get("means").batcher.pending)
                assert state.budget.used >= 3 * ROW_BYTES  # decoded: the request holds its rows
                queued.cancel()
                await asyncio.gather(queued, return_exceptions=True)
                await until(lambda: state.budget.used == 0)

                decoder.release.clear()
                decoder.entered.clear()
                gone = asyncio.create_task(_post(session, url, [PIXEL] * 8))
                await until(decoder.entered.is_set)
                gone.cancel()  # closes its connection: the request ends, its decodes run on
                await asyncio.gather(gone, return_exceptions=True)
                await until(lambda: state.infer_requests.count == 0)
                assert state.budget.used >= 8 * ROW_BYTES + _decode_charge(state, 8)
                decoder.release.set()
                await until(lambda: state.budget.used == 0)
        finally:
            decoder.release.set()
            await runner.cleanup()
    asyncio.run(scenario())


def test_a_request_whose_pictures_pass_the_per_request_limit_is_413_before_any_decodes(models):
    """8 rows of 768 KiB are over a limit of 4 MiB, however small the files: 413 naming them,
    with no picture decoded (the bad last one would have been a 400); 2 rows fit."""
    config = server_config(models, images={"workers": 2}, max_request_bytes=4 << 20)

    async def scenario():
        runner, state, url, _, _ = await started_app(config)
        decoder = _HeldDecoder(state.images, held=False)
        try:
            async with aiohttp.ClientSession() as session:
                status, headers, out = await _post(session, url, [PIXEL] * 7 + [b"not a picture"])
                assert status == 413 and not headers.get("Retry-After"), out
                assert "the input tensors of its images" in out["error"] and "max_request_bytes" in out["error"], out
                assert out["error"].endswith("send fewer pictures per request (each is a row of 0.8 MiB of input "
                                             "'x', whatever the size of its file)"), out
                assert decoder.calls == 0
                status, _, out = await _post(session, url, [PIXEL] * 2)
                assert status == 200 and decoder.calls == 2, out
                np.testing.assert_allclose(out["outputs"][0]["data"], MEANS * 2, rtol=RTOL)
            assert state.budget.used == 0
        finally:
            await runner.cleanup()
    asyncio.run(scenario())
