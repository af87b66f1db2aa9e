"""trace/analysis.py on a hand-built timeline whose answers are known exactly."""
from __future__ import annotations

import pytest

from aclserve.trace import analysis, chrome
from aclserve.trace.records import Anchor, BatchTrace, RequestTrace

US = 1000  # ns per microsecond
T0 = 1_000_000 * US


def _batch(formed, h2d, compute, d2h, slot):
    batch = BatchTrace("m", 4, 3, 1, {2: 1}, T0 + formed * US)
    batch.launched("m#0", 0, slot, direct=False)
    batch.launched_ns = T0 + formed * US
    batch.packed_ns = batch.enqueued_ns = batch.launched_ns
    batch.anchors = dict.fromkeys(("h2d", "compute", "d2h"), Anchor(T0))
    spans = zip(("h2d", "compute", "d2h"), (h2d, compute, d2h))
    batch.device_spans = {name: (a * US, b * US) for name, (a, b) in spans}
    batch.woke_ns = batch.done_ns = T0 + d2h[1] * US
    return batch


def _request(arrival, end, batch, trace_id):
    r = RequestTrace("m", "1", "http", T0 + arrival * US)
    r.id = trace_id
    r.received_ns, r.decoded_ns = r.arrival_ns + 5 * US, r.arrival_ns + 25 * US
    r.enqueued_ns = r.decoded_ns
    r.dispatched_ns = batch.launched_ns
    r.released_ns = r.result_ns = batch.done_ns + 10 * US  # (as run_decoded stamps an answered request's)
    r.encode_start_ns, r.encoded_ns = r.result_ns, r.result_ns + 20 * US
    r.end_ns = T0 + end * US
    r.batch = batch
    return r


def test_busy_overlap_stages_and_verdict():
    first = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    second = _batch(150, (150, 250), (300, 500), (500, 550), slot=1)
    traces = [_request(-30, 600, first, 1), _request(70, 700, second, 2)]
    s = analysis.summarize(chrome.events(traces))
    assert s.requests == 2
    assert abs(s.window_s - 730e-6) < 1e-9
    (busy,) = s.device_busy.values()
    assert abs(busy - 400 / 730) < 1e-6  # compute [100, 500] of the [-30, 700] window
    # copy time 300 us; D2H of the first batch (50) and H2D of the second (100) ran under compute
    assert abs(s.copy_overlap - 0.5) < 1e-9
    assert abs(s.stages_us["decode"] - 20) < 1e-6 and abs(s.stages_us["encode"] - 20) < 1e-6
    assert abs(s.stages_us["compute"] - 200) < 1e-6
    # host stages 30% of a request, the device busy 55%, no CPU time: neither bounds it for sure
    assert s.verdict == ("undetermined: neither the host (traced stages 30% of a request's 0.63 ms) nor the device "
                         "(busy 55%; device-bound from 85%) bounds it; a request's time is compute 32%, other 27%, "
                         "copy in 16%")
    assert abs(s.cost_s["compute"] - 400e-6) < 1e-12  # each batch once
    text = analysis.format_summary(s)
    assert "copy overlap" in text and "verdict" in text


def test_a_corrected_anchor_moves_every_batch_measured_from_it():
    first = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    second = _batch(150, (150, 250), (300, 500), (500, 550), slot=1)
    second.anchors = first.anchors
    first.anchors["compute"].host_ns -= 40 * US  # what DeviceClock.spans does when a batch shows it was late
    assert first.compute == (T0 + 60 * US, T0 + 260 * US) and second.compute == (T0 + 260 * US, T0 + 460 * US)


@pytest.mark.parametrize("compute_on_host, verdict", [
    (False, "host-bound: the event loop, batching and hand-offs (no traced stage) is 62% of server CPU"),
    (True, "compute-bound on the host's cores (an NPU takes the compute off them): the CPU runtime's compute is "
           "40% of server CPU"),
], ids=["npu", "cpu-runtime"])
def test_the_verdict_counts_the_compute_as_host_cpu_only_where_it_runs_on_the_host(compute_on_host, verdict):
    """The device's compute time was taken out of the server's CPU time on an NPU too (what no
    stage explains came out smaller, or 0), and on the CPU runtime, whose compute is the host's
    CPU, a tiny host stage was named the bottleneck of a compute-heavy model ("host-bound:
    unpack is 2%"; found by a helper)."""
    first = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    second = _batch(150, (150, 250), (300, 500), (500, 550), slot=1)
    traces = [_request(-30, 600, first, 1), _request(70, 700, second, 2)]
    s = analysis.summarize(chrome.events(traces), cpu_s=1000e-6, compute_on_host=compute_on_host)
    assert s.verdict.startswith(verdict) and s.verdict.endswith("; the device was busy 55%")
    cpu_line = next(line for line in analysis.format_summary(s).splitlines() if line.startswith("process CPU"))
    assert ("compute 40%" in cpu_line) == compute_on_host


def test_a_saturated_compute_stream_reads_device_bound():
    batches = [_batch(i * 100, (i * 100, i * 100 + 5), (i * 100 + 5, i * 100 + 100), (i * 100 + 100, i * 100 + 102),
                      slot=i % 2) for i in range(20)]
    traces = [_request(b.launched_ns // US - T0 // US, b.done_ns // US - T0 // US + 40, b, i + 1)
              for i, b in enumerate(batches)]
    s = analysis.summarize(chrome.events(traces), cpu_s=1.0)
    assert s.verdict.startswith("device-bound")


def test_no_requests():
    assert analysis.summarize([]).verdict.startswith("no traced requests")


def test_a_direct_batchs_copies_are_drawn_on_its_compute_stream_and_counted_as_copies():
    """They ran there (alone in flight: no copy streams); drawn on the H2D track they could overlap
    a piped batch's copy-in that ran beside them on the copy stream (a trace test failed so once)."""
    direct = _batch(0, (0, 50), (50, 250), (250, 300), slot=0)
    direct.direct = True
    piped = _batch(100, (100, 200), (300, 500), (500, 550), slot=1)  # its copy-in under the direct one's compute
    events = chrome.events([_request(-10, 400, direct, 1), _request(90, 600, piped, 2)])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    track = {e["name"]: names[(e["pid"], e["tid"])] for e in events if e["ph"] == "X" and "#" in e["name"]}
    assert track["H2D batch #%d" % direct.id] == track["D2H batch #%d" % direct.id] == "compute stream"
    assert track["H2D batch #%d" % piped.id] == "H2D stream" and track["D2H batch #%d" % piped.id] == "D2H stream"
    s = analysis.summarize(events)
    (busy,) = s.device_busy.values()
    assert abs(busy - 400 / 610) < 1e-6  # compute [50, 250] and [300, 500] of [-10, 600]: copies not counted


def test_failed_requests_are_counted_apart_and_left_out_of_the_figures():
    """`aclserve profile` on a full queue: 15 answers of 300 ms and 5,149 refusals of a few
    microseconds were averaged together, 'per request 2.6 ms' and a p99 of 0.3 ms."""
    batch = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    answered = _request(-30, 600, batch, 1)
    refused = []
    for i in range(50):
        r = RequestTrace("m", "1", "http", T0 + (700 + i) * US)
        r.id, r.status = 2 + i, 503
        r.received_ns, r.end_ns = r.arrival_ns, r.arrival_ns + 2 * US
        refused.append(r)
    s = analysis.summarize(chrome.events([answered] + refused))
    assert (s.requests, s.failed) == (1, 50)
    assert abs(s.p99_ms - 0.63) < 1e-9 and abs(s.window_s - 630e-6) < 1e-9  # the answered one's alone
    assert analysis.format_summary(s).startswith("1 traced requests over 0.00 s (50 more failed: left out of")
    only_refused = analysis.summarize(chrome.events(refused))
    assert only_refused.verdict == "no answered requests among 50 traced: nothing to say"


def _queued_behind_a_slow_device():
    """Eight batches computing 5 ms each, 1 ms apart (the device busy 70%), each answering a request
    that waited 10 ms in its queue: decode, encode and the copies are 60 us of its 15 ms."""
    batches = [_batch(i * 6000, (i * 6000, i * 6000 + 10), (i * 6000 + 10, i * 6000 + 5010),
                      (i * 6000 + 5010, i * 6000 + 5020), slot=0) for i in range(8)]
    return [_request(i * 6000 - 10_000, i * 6000 + 5060, b, i + 1) for i, b in enumerate(batches)]


@pytest.mark.parametrize("cpu_s", [None, 0.005], ids=["url", "in-process"])
def test_requests_that_wait_in_the_queue_read_queueing_not_host_bound(cpu_s):
    """Below DEVICE_BOUND the verdict was always the largest host stage, however small: a tester's
    `profile --url` of requests of 17 ms, their host stages under 0.5 ms, read "host-bound: decode
    is 38% of traced host time; the device was busy 74%" (in-process the same with the server's CPU
    mostly idle)."""
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu_s=cpu_s)
    cores = "" if cpu_s is None else ", 0.09 CPU cores used"
    assert s.verdict == (f"queueing: a request waits in its queue 66% of its time (compute 33%); neither the host "
                         f"(traced stages under 1% of a request's 15.1 ms{cores}) nor the device (busy 70%; "
                         f"device-bound from 85%) bounds it")


def test_host_stages_that_are_most_of_a_request_read_host_bound():
    batches = [_batch(i * 1000, (i * 1000, i * 1000 + 10), (i * 1000 + 10, i * 1000 + 110),
                      (i * 1000 + 110, i * 1000 + 120), slot=0) for i in range(4)]
    traces = []
    for i, b in enumerate(batches):  # decoded in 400 us, encoded in 300: host stages 720 us of 835
        r = _request(i * 1000 - 405, i * 1000 + 450, b, i + 1)
        r.decoded_ns = r.enqueued_ns = b.launched_ns
        r.encoded_ns = r.end_ns = r.encode_start_ns + 300 * US
        traces.append(r)
    s = analysis.summarize(chrome.events(traces))
    assert s.verdict == ("host-bound: decode is 56% of traced host time (itself 86% of a request's 0.835 ms); the "
                         "device was busy 10%")
