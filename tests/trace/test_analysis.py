"""trace/analysis.py on a hand-built timeline whose answers are known exactly."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from aclserve.trace import analysis, chrome, host_cpu
from aclserve.trace.host_cpu import HostCpu
from aclserve.trace.records import Anchor, BatchTrace, RequestTrace
from tests import REPO

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


def _two_batches():
    first = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    second = _batch(150, (150, 250), (300, 500), (500, 550), slot=1)
    return chrome.events([_request(-30, 600, first, 1), _request(70, 700, second, 2)])


def _cpu_line(s: analysis.Summary) -> str:
    return next(line for line in analysis.format_summary(s).splitlines() if line.startswith("process CPU"))


@pytest.mark.parametrize("compute_on_host, roles, verdict", [
    (False, {host_cpu.EVENT_LOOP: 620e-6, host_cpu.COMPLETERS: 200e-6, host_cpu.NATIVE: 180e-6},
     "host-bound: event loop (decode, batching, encode) took 62% of the server's CPU (0.91 of 2 cores); the device "
     "was busy 55%"),
    (True, {host_cpu.STREAMS: 600e-6, host_cpu.EVENT_LOOP: 300e-6, host_cpu.LAUNCHERS: 100e-6},
     "compute-bound on the host's cores: CPU runtime streams (compute, copies) took 60% of the server's CPU (0.91 of "
     "2 cores); the compute and the host's work share those cores (about 1.1 of its 2 cores free: more instances help "
     "up to them, not past; an NPU takes the compute off them); the compute stream was busy 55%"),
], ids=["npu", "cpu-runtime"])
def test_the_verdict_names_the_threads_that_took_the_most_cpu(compute_on_host, roles, verdict):
    """On the CPU runtime, whose compute is the host's CPU, a tiny host stage was named the
    bottleneck of a compute-heavy model ("host-bound: unpack is 2%"; found by a helper)."""
    cpu = HostCpu(seconds=1100e-6, cpu_s=1000e-6, cores=2, roles=roles, waited_s=0.0)
    s = analysis.summarize(_two_batches(), cpu, compute_on_host=compute_on_host)
    assert s.verdict == verdict


def test_the_cpu_line_gives_shares_of_cpu_time_that_add_up_not_of_the_spans_wall_clock():
    """A tester's `taskset -c 1 aclserve profile medium` printed `process CPU 1.77 s: compute 146%`
    (477% with two busy loops on that core): the compute spans' wall-clock time, which counts the
    time the compute thread was preempted, divided by the process's CPU time; and what no stage
    explained (the event loop) was clamped to 0, left out. Here the compute spans 400 us of the run
    while the CPU runtime's streams took 150 us of CPU, 300 us in all."""
    roles = {host_cpu.STREAMS: 150e-6, host_cpu.EVENT_LOOP: 100e-6, host_cpu.COMPLETERS: 33e-6,
             host_cpu.LAUNCHERS: 17e-6}
    s = analysis.summarize(_two_batches(), HostCpu(seconds=730e-6, cpu_s=300e-6, cores=1, roles=roles,
                                                   waited_s=500e-6), compute_on_host=True)
    assert s.cost_s["compute"] > s.host.cpu_s  # (the wall-clock compute is more than all the CPU)
    assert _cpu_line(s) == (
        "process CPU   0.00 s over 0.00 s (0.41 of 1 core; its threads waited 0.00 s for a core): CPU runtime "
        "streams (compute, copies) 50%, event loop (decode, batching, encode) 33%, completers (unpack) 11%, "
        "launchers (pack) 6%")


def test_the_cpu_line_is_measured_from_each_threads_cpu_time():
    """The meter's figures, real: the test's own thread (the meter's event loop) and a thread named as
    an instance's launcher each spin for a known CPU time."""
    def spin(cpu_s):
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass
    spun, stopped = threading.Event(), threading.Event()

    def launch():  # (alive until the meter stops: an ended thread's CPU is not told apart)
        spin(0.1)
        spun.set()
        stopped.wait()
    meter = host_cpu.CpuMeter()
    launcher = threading.Thread(target=launch, name="m:1#0-launch")
    launcher.start()
    spin(0.2)
    spun.wait()
    cpu = meter.stop()
    stopped.set()
    launcher.join()
    assert cpu.roles[host_cpu.EVENT_LOOP] >= 0.2 and 0.1 <= cpu.roles[host_cpu.LAUNCHERS] < 0.2
    assert abs(sum(cpu.roles.values()) - cpu.cpu_s) < 1e-9 and cpu.waited_s is not None
    s = analysis.summarize(_two_batches(), cpu)
    shares = [int(share) for share in re.findall(r" (\d+)%", _cpu_line(s).split("): ", 1)[1])]
    assert sum(shares) == 100


def _saturated_compute_stream():
    """20 batches computing 95 us each, back to back: the compute stream busy 93% of the run."""
    batches = [_batch(i * 100, (i * 100, i * 100 + 5), (i * 100 + 5, i * 100 + 100), (i * 100 + 100, i * 100 + 102),
                      slot=i % 2) for i in range(20)]
    return chrome.events([_request(b.launched_ns // US - T0 // US, b.done_ns // US - T0 // US + 40, b, i + 1)
                          for i, b in enumerate(batches)])


def test_a_saturated_compute_stream_reads_device_bound():
    s = analysis.summarize(_saturated_compute_stream(), HostCpu(seconds=2e-3, cpu_s=1e-3, cores=1))
    assert s.verdict.startswith("device-bound")


def test_a_saturated_compute_stream_of_the_cpu_runtime_reads_compute_bound_on_the_cores_it_shares():
    """A tester's `taskset -c 1 aclserve profile medium` (CPU runtime) read "device-bound: ... more
    instances or devices help, host work does not": its "device" is the one core the server's own
    work runs on too, so more instances do not help past it. Here the streams took 85% of the
    server's CPU, which filled its one core."""
    roles = {host_cpu.STREAMS: 1.7e-3, host_cpu.EVENT_LOOP: 0.24e-3, host_cpu.COMPLETERS: 0.06e-3}
    cpu = HostCpu(seconds=2.06e-3, cpu_s=2e-3, cores=1, roles=roles, waited_s=0.5e-3)
    s = analysis.summarize(_saturated_compute_stream(), cpu, compute_on_host=True)
    assert s.verdict == ("compute-bound on the host's cores: CPU runtime streams (compute, copies) took 85% of the "
                         "server's CPU (0.97 of 1 core); the compute and the host's work share those cores (its cores "
                         "are full: more instances would share them, not add to them; an NPU takes the compute off "
                         "them); the compute stream was busy 93%")


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
    s.requests = 21318  # (written with its thousands separator, as profile's first line writes its counts)
    assert analysis.format_summary(s).startswith("21,318 traced requests over 0.00 s")
    only_refused = analysis.summarize(chrome.events(refused))
    assert only_refused.verdict == "no answered requests among 50 traced: nothing to say"


def _queued_behind_a_slow_device():
    """Eight batches computing 5 ms each, 1 ms apart (the device busy 70%), each answering a request
    that waited 10 ms in its queue: decode, encode and the copies are 60 us of its 15 ms."""
    batches = [_batch(i * 6000, (i * 6000, i * 6000 + 10), (i * 6000 + 10, i * 6000 + 5010),
                      (i * 6000 + 5010, i * 6000 + 5020), slot=0) for i in range(8)]
    return [_request(i * 6000 - 10_000, i * 6000 + 5060, b, i + 1) for i, b in enumerate(batches)]


@pytest.mark.parametrize("cpu_s", [None, 0.0014], ids=["url", "in-process"])
def test_requests_that_wait_in_the_queue_read_queueing_not_host_bound(cpu_s):
    """Below DEVICE_BOUND the verdict was always the largest host stage, however small: a tester's
    `profile --url` of requests of 17 ms, their host stages under 0.5 ms, read "host-bound: decode
    is 38% of traced host time; the device was busy 74%" (in-process the same with the server's CPU
    mostly idle)."""
    cpu = None if cpu_s is None else HostCpu(seconds=0.0151, cpu_s=cpu_s, cores=1, roles={host_cpu.EVENT_LOOP: cpu_s},
                                             waited_s=0.001)  # (its threads hardly waited for the core)
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu)
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


def test_a_server_kept_waiting_for_a_core_reads_host_cpu_taken_not_queueing():
    """A tester's digits run on a core other processes held read "queueing: ... neither the host (...
    0.18 CPU cores used) nor the device bounds it": the server was preempted, not idle. Here its
    threads waited for the core 2.88 s of a 3 s run while it used a quarter of it."""
    cpu = HostCpu(seconds=3.0, cpu_s=0.75, cores=1, roles={host_cpu.EVENT_LOOP: 0.45, host_cpu.STREAMS: 0.3},
                  waited_s=2.88)
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu, compute_on_host=True)
    assert s.verdict == ("host CPU taken by others: the server's threads waited 2.88 s for a core (runnable, not "
                         "running) over the 3.00 s run while it used 0.25 of its 1 core: other processes held them, "
                         "and the times above include that wait; of its own CPU, event loop (decode, batching, "
                         "encode) took 60%; the device was busy 70%")


def test_a_server_throttled_by_its_cpu_quota_reads_held_back_by_it_naming_the_quota():
    """A reviewer's server in a cgroup of 0.3 cores on 2 read "host CPU taken by others: ... used
    0.31 of its 2 cores: other processes held them": its quota's throttling was the wait. Its four
    threads waited 5 s of a 3 s run, throttled 2.1 s (`aclserve profile digits` in such a cgroup)."""
    cpu = HostCpu(seconds=3.0, cpu_s=0.9, cores=0.3, roles={host_cpu.EVENT_LOOP: 0.63, host_cpu.STREAMS: 0.27},
                  waited_s=4.98, quota=0.3, throttled_s=2.1)
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu, compute_on_host=True)
    assert s.verdict == ("held back by its CPU quota: the server used 0.30 of its cgroup's CPU quota of 0.3 cores, "
                         "throttled 2.10 s by it, its threads waiting 4.98 s for a core (runnable, not running) over "
                         "the 3.00 s run: the quota held them, not other processes, and the times above include that "
                         "wait; more instances share the quota, not add to it: a larger one (docker --cpus, "
                         "Kubernetes limits.cpu) helps; of its own CPU, event loop (decode, batching, encode) took "
                         "70%; the device was busy 70%")
    assert _cpu_line(s) == ("process CPU   0.90 s over 3.00 s (0.30 of 0.3 cores, its CPU quota; its threads waited "
                            "4.98 s for a core; the quota throttled it 2.10 s): event loop (decode, batching, encode) "
                            "70%, CPU runtime streams (compute, copies) 30%")


def test_a_wait_the_quota_does_not_account_for_is_still_others_taking_the_host():
    """Under a quota of 1.5 cores it used a sixth of, the wait was other processes'."""
    cpu = HostCpu(seconds=3.0, cpu_s=0.75, cores=1.5, roles={host_cpu.EVENT_LOOP: 0.75}, waited_s=2.8, quota=1.5,
                  throttled_s=0.1)
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu, compute_on_host=True)
    assert s.verdict.startswith("host CPU taken by others: the server's threads waited 2.80 s for a core (runnable, "
                                "not running) over the 3.00 s run while it used 0.25 of its 1.5 cores: other")


def test_a_server_that_waits_on_its_own_threads_on_full_cores_is_not_said_held_by_others():
    """Its threads take turns on the one core it may use (the event loop waits while the compute
    runs): waiting, yet the server used the core, so it bounds itself."""
    cpu = HostCpu(seconds=0.0151, cpu_s=0.0148, cores=1, roles={host_cpu.STREAMS: 0.0118, host_cpu.EVENT_LOOP: 0.003},
                  waited_s=0.012)
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu, compute_on_host=True)
    assert s.verdict.startswith("compute-bound on the host's cores")


def test_the_meter_reads_the_wait_for_a_core_another_process_holds(tmp_path):
    """Real figures: a process pinned to one core beside a busy process pinned there too waits for it."""
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys, time
        from aclserve.trace.host_cpu import CpuMeter
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # (inherits the one core)
        try:
            meter = CpuMeter()
            end = time.thread_time() + 0.3
            while time.thread_time() < end:
                pass
            cpu = meter.stop()
        finally:
            busy.kill()
            busy.wait()
        print(cpu.waited_s, cpu.cores)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    waited, cores = out.stdout.split()
    assert float(waited) > 0 and cores == "1", out.stderr
