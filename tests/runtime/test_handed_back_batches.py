"""Batches an instance's launcher hands back to its pool unlaunched (its device found failed as a
whole after they were queued there: launcher.py, pool.not_launched), as the pool counts and
answers them.

A re-run's launch is counted (aclserve_batch_reruns_total) when an instance's launcher puts it on
the device, so one handed back counts once when it runs elsewhere, and not at all when nothing can
run it (counted when the pool gave it to an instance and taken back, the counter went down). A
new batch handed back never ran, so once answered DeviceFailed it is no failed batch; a retry
handed back and answered because nothing can run it is one failed batch, answered with the error
its first run failed with (the launch had cleared it). Several handed back keep their order,
ahead of the batches waiting already.

Two CPU devices; device 1 is failed by the CPU runtime's fault injection through another model
(`finder`), in a process of its own per test (the device stays failed until every user lets go
of it). A batch is queued on a launcher by holding the launcher inside the launch before it
(execute_call hold); a part of a split batch runs alone on its instance, so nothing is ever queued
before it: the test holds the pool's BatchFaults lock, which its launch takes between the pool's
choice of the instance and the hand-over to the launcher, while the device is found failed."""
from __future__ import annotations

from .own_process import run_script

_PRELUDE = """
import json, logging, sys, threading, time
import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import AclRuntime
from aclserve.runtime.builder import open_pool
from aclserve.runtime.futures import BatchFutures
from tests.tiny_models import affine_request

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
out = {}


def outcome(future):
    try:
        return f"answered by {future.result(timeout=60).instance}"
    except aclserve.ExecutionFailed as e:
        return f"{type(e).__name__}: {e}"


def wait_for(condition, what):
    for _ in range(6000):  # (a bound, not a timing: each look polls the pool's state)
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def counts(pool):
    return {**pool.batch_faults.outcomes(), "reruns": pool.batch_faults.reruns}


def fail_device_1(finder):
    faults.inject("execute", nth=1, code=507054, device=True, model_id=finder.pool.instances[0].model.model_id)
    finder.submit([affine_request(1)], gear=1).exception(timeout=60)  # answered once found failed (probed)


def hold_launcher(model, lane, gate, first_id=100):
    held = faults.inject("execute_call", nth=1, hold=gate, model_id=model.pool.instances[lane].model.model_id)
    future = model.submit([affine_request(1, first_id)], gear=1, lane=lane)
    assert held.entered.wait(30)
    return future


runtime = AclRuntime(device="cpu").start()
path = sys.argv[1]
"""

_END = """
for model in models:
    model.pool.close()
runtime.close()
print(json.dumps(out))
"""

# A batch fails on lane 0 (device 0) and is retried whole. Lane 0's rebuild is held (its load),
# so the retry goes to lane 1 (device 1), queued behind a launch held there (`ahead`); `alone`
# (device 1 only) has a new batch queued likewise. Device 1 is then found failed and the launches
# let go: the queued batches come back to their pools unlaunched.
_RETRY_QUEUED = _PRELUDE + """
spread = BatchFutures(open_pool(runtime, path, "spread", instances=2, devices=(0, 1)))
alone = BatchFutures(open_pool(runtime, path, "alone", devices=(1,)))
finder = BatchFutures(open_pool(runtime, path, "finder", devices=(1,)))
models = (spread, alone, finder)
launch_gate, load_gate = threading.Event(), threading.Event()
ahead, alone_ahead = hold_launcher(spread, 1, launch_gate), hold_launcher(alone, 0, launch_gate)
queued = alone.submit([affine_request(1, 7)], gear=1, lane=0)
rebuild = faults.inject("load", nth=1, hold=load_gate)
faults.inject("execute", nth=1, model_id=spread.pool.instances[0].model.model_id)  # 507011 on lane 0
retried = spread.submit([affine_request(1, 5)], gear=1, lane=0)
wait_for(lambda: spread.pool.instances[1].in_flight == 2, "the retry queued on lane 1")
assert rebuild.entered.wait(30)
"""

_RETRY_RUNS_ELSEWHERE = _RETRY_QUEUED + """
load_gate.set()
wait_for(lambda: spread.pool.rebuilds == 1, "lane 0 rebuilt")
fail_device_1(finder)
launch_gate.set()
out["retried"], out["ahead"] = outcome(retried), outcome(ahead)
out["counts"] = counts(spread.pool)
""" + _END

_RETRY_NEVER_RUNS = _RETRY_QUEUED + """
fail_device_1(finder)
launch_gate.set()
out["retried"], out["queued"], out["alone_ahead"] = outcome(retried), outcome(queued), outcome(alone_ahead)
out["before_rebuild"] = counts(spread.pool)  # (ahead's retry waits for lane 0's rebuild)
out["alone"] = counts(alone.pool)
load_gate.set()
out["ahead"] = outcome(ahead)
out["counts"] = counts(spread.pool)
""" + _END

# A batch of two requests fails on lane 0 (device 1) and is split: its parts run alone on lane 0
# once rebuilt. The first part's launch there is held between the pool's choice of lane 0 and the
# hand-over to its launcher (pool._launch, wrapped) while device 1 is found failed.
_PART_QUEUED = _PRELUDE + """
iso = BatchFutures(open_pool(runtime, path, "iso", instances=int(sys.argv[2]), devices=(1, 0)))
finder = BatchFutures(open_pool(runtime, path, "finder", devices=(1,)))
models = (iso, finder)
first = iso.pool.instances[0]
faults.inject("execute", nth=1, model_id=first.model.model_id)  # 507011 on lane 0
part_gate, launch = threading.Event(), iso.pool._launch


def held_launch(batch, lane, slot):
    if batch.failed_lane is not None:  # a part: held once its lane and slot are chosen
        part_gate.wait(60)
    launch(batch, lane, slot)


iso.pool._launch = held_launch
split = iso.submit([affine_request(1, 1), affine_request(1, 2)], gear=2, lane=0)
wait_for(lambda: iso.pool.instances[0] is not first and iso.pool.instances[0].in_flight == 1,
         "the first part given lane 0, rebuilt")
fail_device_1(finder)
part_gate.set()
try:
    batch = split.result(timeout=60)
    out["split"] = {"errors": [None if e is None else f"{type(e).__name__}: {e}" for e in batch.errors or ()],
                    "instance": batch.instance, "runs": [run.instance for run in batch.runs]}
except aclserve.ExecutionFailed as e:
    out["split"] = f"{type(e).__name__}: {e}"
out["counts"] = counts(iso.pool)
""" + _END

# Three batches queued on lane 0 (device 1) behind a held launch; lane 1 (device 0) full, held
# too; two batches submitted after them wait in the pool. Device 1 is found failed, its launch
# let go (retry off: that batch fails), then lane 1's.
_SEVERAL_QUEUED = _PRELUDE + """
pool = open_pool(runtime, path, "several", instances=2, devices=(1, 0), slots=4, retry=False)
order = BatchFutures(pool)
finder = BatchFutures(open_pool(runtime, path, "finder", devices=(1,)))
models = (order, finder)
failed_gate, healthy_gate = threading.Event(), threading.Event()
ran = []


def submit(name, lane):
    future = order.submit([affine_request(1, len(ran) + 10)], gear=1, lane=lane)
    future.add_done_callback(lambda f: ran.append(name))  # (the completion thread, in completion order)
    return future


futures = [hold_launcher(order, 0, failed_gate)]
futures += [submit(name, 0) for name in ("queued1", "queued2", "queued3")]
futures += [hold_launcher(order, 1, healthy_gate, 200)]
futures += [submit(name, 1) for name in ("busy1", "busy2", "busy3")]
futures += [submit(name, None) for name in ("waiting1", "waiting2")]
wait_for(lambda: pool.instances[0].in_flight == pool.instances[1].in_flight == 4, "both lanes full")
fail_device_1(finder)
failed_gate.set()
wait_for(lambda: len(pool._pending) == 5, "the three handed back waiting with the two")
healthy_gate.set()
for future in futures:
    future.exception(timeout=60)
out["ran"] = ran
""" + _END


def _handed_back(stderr: str, instance: str, count: int = 1) -> bool:
    return (f"{instance}: {count} queued batch(es) not launched: device 1 failed as a whole; handed back to the "
            f"pool") in stderr


def test_a_retry_handed_back_counts_one_re_run_when_it_runs_elsewhere(affine_om):
    """The retry's launch on lane 1 was counted, then counted again on the rebuilt lane 0: 3 re-runs
    for 2 (the batch's and `ahead`'s, refused by the failed device and retried on lane 0)."""
    out, stderr = run_script(_RETRY_RUNS_ELSEWHERE, affine_om(), devices=2)
    assert _handed_back(stderr, "spread#1"), stderr[-3000:]
    assert out["retried"] == out["ahead"] == "answered by spread#0", out
    assert out["counts"] == {"retried": 2, "rerun_alone": 0, "failed": 0, "reruns": 2}, out


def test_a_retry_handed_back_that_nothing_can_run_is_one_failed_batch_with_its_first_error(affine_om):
    """Nothing can run the retry handed back (lane 0 holds the instance it failed on, its rebuild
    held; lane 1 is on the failed device): answered at once with the error its run on device 0
    failed with (it got "model spread: no healthy instance can run the batch": its launch on lane 1
    had cleared it), one failed batch, its re-run not counted (it was). `alone`'s new batch handed
    back never ran: answered DeviceFailed, no failed batch (it counted as one, beside `alone_ahead`,
    whose launch the failed device refused)."""
    out, stderr = run_script(_RETRY_NEVER_RUNS, affine_om(), devices=2)
    assert _handed_back(stderr, "spread#1") and _handed_back(stderr, "alone#0"), stderr[-3000:]
    assert out["retried"].startswith("ExecutionFailed: batch of 1 row (gear 1) failed on device 0, instance "
                                     "spread#0: "), out
    assert out["before_rebuild"] == {"retried": 0, "rerun_alone": 0, "failed": 1, "reruns": 0}, out
    assert out["ahead"] == "answered by spread#0", out  # (retried on lane 0 once rebuilt)
    assert out["counts"] == {"retried": 1, "rerun_alone": 0, "failed": 1, "reruns": 1}, out
    assert out["queued"].startswith("DeviceFailed: model alone: device 1 failed as a whole"), out
    assert out["alone_ahead"].startswith("DeviceFailed: batch of 1 row (gear 1) failed on device 1, instance "
                                         "alone#0"), out
    assert out["alone"] == {"retried": 0, "rerun_alone": 0, "failed": 1, "reruns": 0}, out


def test_a_part_handed_back_counts_one_re_run_when_it_runs_elsewhere(affine_om):
    """The first part comes back from lane 0 and runs alone on lane 1 (device 0), the second part
    after it: 2 re-runs, not 3; the batch split once (rerun_alone), both its requests answered."""
    out, stderr = run_script(_PART_QUEUED, affine_om(), "2", devices=2)
    assert _handed_back(stderr, "iso#0"), stderr[-3000:]
    assert out["split"] == {"errors": [], "instance": "iso#1", "runs": ["iso#1", "iso#1"]}, out
    assert out["counts"] == {"retried": 0, "rerun_alone": 1, "failed": 0, "reruns": 2}, out


def test_a_part_handed_back_that_nothing_can_run_counts_no_re_run_and_keeps_its_first_error(affine_om):
    """One instance, on device 1: neither part can run. No re-run (it counted 1: the handed-back
    part's launch); the batch, counted once, fails with the error it failed with first, as the
    second part, never launched, did already (the first part got "DeviceFailed: model iso: device 1
    failed as a whole ...": its launch had cleared it)."""
    out, stderr = run_script(_PART_QUEUED, affine_om(), "1", devices=2)
    assert _handed_back(stderr, "iso#0"), stderr[-3000:]
    assert out["split"].startswith("ExecutionFailed: batch of 2 rows (gear 2) failed on device 1, instance "
                                   "iso#0: "), out
    assert out["counts"]["reruns"] == 0, out
    assert sum(n for outcome, n in out["counts"].items() if outcome != "reruns") == 1, out


def test_several_batches_handed_back_keep_their_order_ahead_of_those_waiting(affine_om):
    """The three handed back wait for lane 1 in the order they were queued on lane 0, ahead of the
    two that waited already (dispatched after them): lane 1 runs its own, then them in that order."""
    out, stderr = run_script(_SEVERAL_QUEUED, affine_om(), devices=2)
    assert _handed_back(stderr, "several#0", 3), stderr[-3000:]
    ran = [name for name in out["ran"] if not name.startswith("busy")]
    assert ran == ["queued1", "queued2", "queued3", "waiting1", "waiting2"], out
    assert out["ran"][:3] == ["busy1", "busy2", "busy3"], out
