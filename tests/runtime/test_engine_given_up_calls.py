"""An Engine call given up (its future cancelled, infer()'s timeout passed; Ctrl-C in infer() is
test_engine_interrupt.py's) while it had runs left: a call of more rows than the largest gear is
split into runs, and every one of them ran, however long, before the next call had the model
(found by tester t46). Now the runs not launched are dropped; those launched finish unheard.
Counted in runs, not time: the CPU runtime's executions since a held one (its fault table counts
every execute it sees)."""
from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import Engine

from tests import REPO
from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")

RUNS = 100  # a call of 200 rows in gears of at most 2
SLOTS = 2  # one instance: at most two runs of a call launched at a time


def test_a_cancelled_call_drops_its_runs_not_launched_and_the_next_call_comes_after_those_launched(affine_om):
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(batch="1,2"), slots=SLOTS)
        gate = threading.Event()
        held = faults.inject("execute", nth=1, hold=gate, code=0)  # counts every execute from here
        try:
            big = model.submit(affine_request(2 * RUNS))
            assert held.entered.wait(60) and big.cancel()
            small = model.submit(affine_request(1))
            executions_by_answer = []
            small.add_done_callback(lambda _: executions_by_answer.append(held.seen))
        finally:
            gate.set()
        np.testing.assert_array_equal(small.result(timeout=60)["s"], affine_request(1)["idx"] * 2)
        model.close()  # (waits for the runs the cancelled call launched)
    assert executions_by_answer == [SLOTS + 1], "the next call waited for the cancelled call's runs"
    assert held.seen == SLOTS + 1, f"{held.seen} runs of {RUNS} ran"


def test_a_call_past_its_infer_timeout_drops_its_runs_not_launched(affine_om):
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(batch="1,2"), slots=SLOTS)
        gate = threading.Event()
        held = faults.inject("execute", nth=1, hold=gate, code=0)
        try:  # (the device holds the first run: the timeout passes whatever the machine's pace)
            with pytest.raises(concurrent.futures.TimeoutError, match="not launched yet are dropped"):
                model.infer(affine_request(2 * RUNS), timeout=0.1)
        finally:
            gate.set()
        model.close()
    assert held.seen == SLOTS, f"{held.seen} runs of {RUNS} ran"


def test_a_call_answered_by_a_failed_run_drops_its_runs_not_launched(affine_om):
    """Its answer is the error: the runs left would run unheard as well."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(batch="1,2"), slots=1, retry=False)  # (one run at a time)
        failing = faults.inject("execute", nth=1)  # counts every execute from here
        with pytest.raises(aclserve.ExecutionFailed, match="507011"):
            model.infer(affine_request(2 * RUNS), timeout=60)
        model.close()
    assert failing.seen == 1, f"{failing.seen} runs of {RUNS} ran"


EXIT_WITH_A_CANCELLED_CALL = """
import atexit, sys, threading, time
atexit.register(lambda: print("runs", held.seen, flush=True))  # (registered first: runs after the Engine's close)
import aclserve
from aclserve.acl.cpu import faults
from tests.tiny_models import affine_request
engine = aclserve.Engine(device="cpu")
model = engine.load(sys.argv[1], slots=2)  # (SLOTS)
gate = threading.Event()
held = faults.inject("execute", nth=1, hold=gate, code=0)
cancelled = model.submit(affine_request(200))
held.entered.wait(60)
cancelled.cancel()
unanswered = model.submit(affine_request(1))

def let_go_once_closing():
    while not model.closed:
        time.sleep(0.005)
    gate.set()
threading.Thread(target=let_go_once_closing, daemon=True).start()
"""


def test_the_exit_says_what_it_waits_for_and_not_for_the_runs_a_cancelled_call_did_not_launch(affine_om):
    """An Engine left open at exit is closed then, its calls' runs waited for: all of a cancelled
    call's, in silence (tester t46). Now those it launched, said in a WARNING line."""
    proc = subprocess.run([sys.executable, "-c", EXIT_WITH_A_CANCELLED_CALL, affine_om(batch="1,2")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"exit: an Engine left open is closed; model affine: waiting at most \d+ s for 1 call\(s\) not "
                     r"answered yet and 2 run\(s\) handed to the device \(launched or queued\) by calls answered or "
                     r"given up", proc.stderr), \
        proc.stderr[-2000:]
    assert proc.stdout.split() == ["runs", str(SLOTS + 1)], (proc.stdout, proc.stderr[-2000:])
