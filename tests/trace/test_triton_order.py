"""Triton's trace format promises COMPUTE_START <= COMPUTE_INPUT_END <= COMPUTE_OUTPUT_START <=
COMPUTE_END (its trace_summary.py subtracts them). The device's times are placed on the host's
clock from anchors (runtime/device_clock.py), which a tester saw put a copy-in's end up to 1.4 ms
before its batch's launch, with runs delayed by injected faults (176 of 450 traces)."""
from __future__ import annotations

from aclserve.trace import triton
from aclserve.trace.records import CLIENT_GONE, Anchor, BatchTrace, RequestTrace

NAMES = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _compute_stamps(h2d: tuple[int, int], compute: tuple[int, int]) -> list[int]:
    batch = BatchTrace("m", 4, 4, 1, {1: 1}, formed_ns=1_000)
    batch.launched(instance="m/0", device=0, slot=0, direct=False, launched_ns=10_000)
    batch.anchors = {"h2d": Anchor(0), "compute": Anchor(0)}
    batch.device_spans = {"h2d": h2d, "compute": compute}
    batch.done_ns = 50_000
    trace = RequestTrace("m", "1", "http", arrival_ns=500)
    trace.id, trace.batch = 1, batch
    trace.received_ns = trace.decoded_ns = trace.enqueued_ns = 900
    trace.released_ns = trace.encoded_ns = trace.end_ns = 60_000
    stamps = {stamp["name"]: stamp["ns"] for entry in triton.entries([trace]) for stamp in entry.get("timestamps", [])}
    return [stamps[name] for name in NAMES]


def test_a_copy_in_placed_before_its_launch_is_written_at_the_launch():
    assert _compute_stamps(h2d=(7_000, 8_600), compute=(8_600, 30_000)) == [10_000, 10_000, 30_000, 50_000]


def test_device_times_past_the_batchs_end_are_written_at_its_end():
    assert _compute_stamps(h2d=(10_500, 12_000), compute=(12_000, 55_000)) == [10_000, 12_000, 50_000, 50_000]


def test_times_in_order_are_written_as_they_are():
    assert _compute_stamps(h2d=(10_500, 12_000), compute=(12_000, 40_000)) == [10_000, 12_000, 40_000, 50_000]


def test_a_trace_written_while_its_batch_runs_has_its_launch_only_and_ends_no_earlier():
    """A request whose client left after its batch was formed, written before that batch ended
    (its device times half written by the completion thread meanwhile): its launch came after
    the client left, and trace_summary.py would have read a COMPUTE_OUTPUT_START without its
    COMPUTE_END and a REQUEST_END before COMPUTE_START."""
    batch = BatchTrace("m", 4, 4, 1, {1: 1}, formed_ns=1_000)
    batch.launched(instance="m/0", device=0, slot=0, direct=False, launched_ns=10_000)
    batch.anchors = {"h2d": Anchor(0), "compute": Anchor(0)}
    batch.device_spans = {"h2d": (10_500, 12_000), "compute": (12_000, 40_000)}  # (done_ns still 0)
    trace = RequestTrace("m", "1", "http", arrival_ns=500)
    trace.id, trace.batch, trace.status = 1, batch, CLIENT_GONE
    trace.received_ns = trace.decoded_ns = trace.enqueued_ns = 900
    trace.dispatched_ns = 1_000
    trace.released_ns = trace.end_ns = 5_000  # the client left while its batch waited for an instance
    stamps = {stamp["name"]: stamp["ns"] for entry in triton.entries([trace]) for stamp in entry.get("timestamps", [])}
    assert [name for name in stamps if name.startswith("COMPUTE_")] == ["COMPUTE_START"]
    assert stamps["COMPUTE_START"] == 10_000 <= stamps["REQUEST_END"]
