"""The trace clock places a batch's device spans from an anchor on each stream (event_elapsed_time
times two events of one stream only, and the CPU runtime refuses other pairs): a pipelined
batch, whose copies run on the H2D and D2H streams, keeps all three spans, in stream order.
A real pool on the CPU runtime; the first batch is held in its execution so the second is
launched pipelined."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from aclserve.acl.cpu import faults
from aclserve.runtime import open_pool
from aclserve.runtime.batch import Batch
from aclserve.runtime.device_clock import DeviceClock
from aclserve.runtime.futures import BatchFutures
from aclserve.trace.records import Anchor, BatchTrace, now_ns

from tests.tiny_models import affine_onnx, affine_request, compile_cpu_om

pytestmark = pytest.mark.usefixtures("clean_faults")


def _traced(rows: int, first_id: int) -> tuple[Batch, concurrent.futures.Future]:
    future: concurrent.futures.Future = concurrent.futures.Future()
    batch = Batch([affine_request(rows, first_id)], rows, rows, None, requests=(future,))
    batch.trace = BatchTrace("affine", rows, rows, 1, {2: 1}, now_ns())
    return batch, future


def test_a_pipelined_batch_keeps_its_copy_spans_placed_from_their_own_streams(runtime, tmp_path):
    om = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", "1,2,4")
    pool = open_pool(runtime, om, "affine", slots=2)
    BatchFutures(pool)  # the listener: settles each batch's future
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate)
        first, first_done = _traced(2, 0)
        pool.submit(first)  # alone in flight: direct, and its launch anchors the clock
        assert held.entered.wait(30)
        second, second_done = _traced(2, 10)
        pool.submit(second)  # launched while the first computes: pipelined over the three streams
        deadline = time.monotonic() + 30  # (a hang guard, not a timing)
        while not second.trace.enqueued_ns and time.monotonic() < deadline:
            time.sleep(0.001)
        gate.set()
        first_done.result(30)
        second_done.result(30)
    finally:
        gate.set()
        pool.close()
    assert first.trace.direct and not second.trace.direct
    for trace in (first.trace, second.trace):
        assert set(trace.device_spans) == {"h2d", "compute", "d2h"}
        assert trace.h2d[0] <= trace.h2d[1] <= trace.compute[0] <= trace.compute[1] <= trace.d2h[0] <= trace.d2h[1]
        assert trace.d2h[1] <= trace.woke_ns
    assert len({id(first.trace.anchors[name]) for name in ("h2d", "compute", "d2h")}) == 1  # all on compute
    anchors = second.trace.anchors
    assert len({id(anchors[name]) for name in ("h2d", "compute", "d2h")}) == 3  # one per stream
    assert anchors["compute"] is first.trace.anchors["compute"]
    assert first.trace.compute[1] <= second.trace.compute[0]  # one compute stream: in launch order


def test_an_anchor_moved_back_moves_those_of_the_streams_before_it():
    """A batch shows an anchor late by as much as a span ends after the completion thread woke,
    or after the next stream's span began; moving it back moves the anchors of the streams
    before it (h2d, compute, d2h) too, so the batches placed earlier keep their order."""
    anchors = {role: Anchor(1_000) for role in ("h2d", "compute", "d2h")}
    on = {"h2d": "h2d", "compute": "compute", "d2h": "d2h"}
    offsets = {"h2d": (0, 100), "compute": (90, 300), "d2h": (280, 400)}
    DeviceClock._tighten(anchors, on, offsets, done_by_ns=1_350)
    # d2h ended 50 after the wake-up: all back by 50; then compute ended 20 after the copy-out
    # began: compute and h2d back 20 more; then the copy-in ended 10 after the compute began
    assert {role: a.host_ns for role, a in anchors.items()} == {"h2d": 920, "compute": 930, "d2h": 950}
