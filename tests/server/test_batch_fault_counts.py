"""aclserve_batch_faults_total counted each failed run under `failed` (a re-run's again) and each
re-run under `retried`, so the two overlapped (retried > failed; their sum meant nothing), and its
help said "Batches the device failed" as did aclserve_device_faults_total's, about half as many
(a tester, 2 % execute faults: failed 64, retried 164, device faults 38). Now each batch whose
run failed counts once, by what became of it, the re-runs in a family of their own, and the
device's faults one per fault: a batch failed only because another's fault stopped the context
they shared is a failed batch, not a fault."""
from __future__ import annotations

import concurrent.futures
import json
import threading

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, post_status

from .hostile import metric

GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
LABELS = 'model="double",version="1"'
OUTCOMES = ("retried", "rerun_alone", "failed")


def infer(url: str) -> int:
    return post_status(url, "/v2/models/double/infer", GOOD)


def counts(url: str) -> dict:
    """The version's failed batches by outcome, its re-runs and the device's faults (507011)."""
    found = {outcome: metric(url, "aclserve_batch_faults_total", f'model="double",outcome="{outcome}",version="1"')
             for outcome in OUTCOMES}
    found["reruns"] = metric(url, "aclserve_batch_reruns_total", LABELS)
    found["faults"] = metric(url, "aclserve_device_faults_total", f'code="507011",{LABELS}')
    return found


def test_a_fault_failing_two_batches_counts_one_fault_and_two_failed_batches(double_dir, make_config, clean_faults):
    """One instance, two slots: batch A faults (its context stops) while batch B is in flight
    beside it. Both failed, both are re-run alone and answered: two failed batches, each once
    (rerun_alone), two re-runs, one fault. Then a batch that faults alone, with no other
    instance, is answered 500: failed, no re-run. The outcomes add up to the three failed batches."""
    (double_dir / "double.yaml").write_text("slots: 2\nexecution_timeout_ms: 60000\n")  # (no timeout while held)
    srv = ServerThread(make_config(double_dir)).start()
    fault_gate, launch_gate = threading.Event(), threading.Event()
    try:
        assert counts(srv.url) == dict.fromkeys((*OUTCOMES, "reruns", "faults"), 0)
        faulting = faults.inject("execute", nth=1, hold=fault_gate, code=507011)  # A's run, held, then faulting
        with concurrent.futures.ThreadPoolExecutor(2) as clients:
            first = clients.submit(infer, srv.url)
            assert faulting.entered.wait(30)
            launching = faults.inject("execute_call", nth=1, hold=launch_gate)  # B's launch: B is in flight
            second = clients.submit(infer, srv.url)
            assert launching.entered.wait(30)
            launch_gate.set()
            fault_gate.set()
            assert (first.result(), second.result()) == (200, 200)
        assert counts(srv.url) == {"retried": 0, "rerun_alone": 2, "failed": 0, "reruns": 2, "faults": 1}
        assert metric(srv.url, "aclserve_instance_rebuilds_total", LABELS) == 1  # (the parts ran on it)

        faults.inject("execute", nth=1, code=507011)  # alone in flight, one instance: not run again
        assert infer(srv.url) == 500
        assert counts(srv.url) == {"retried": 0, "rerun_alone": 2, "failed": 1, "reruns": 2, "faults": 2}
    finally:
        fault_gate.set()
        launch_gate.set()
        srv.close()


def test_a_whole_re_run_that_fails_too_is_one_failed_batch(double_dir, make_config, clean_faults):
    """Two instances: a batch faults, is re-run whole on the other instance and faults there
    too (alone: not split). One failed batch (failed), one re-run, two faults; it counted as
    failed twice and retried once."""
    (double_dir / "double.yaml").write_text("instances: 2\n")
    srv = ServerThread(make_config(double_dir)).start()
    try:
        faults.inject("execute", nth=1, count=2, code=507011)  # the run and its re-run
        assert infer(srv.url) == 500
        assert counts(srv.url) == {"retried": 0, "rerun_alone": 0, "failed": 1, "reruns": 1, "faults": 2}
    finally:
        srv.close()
