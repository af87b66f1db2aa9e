"""An Engine call's runs counted out and back whatever raises while they are handed on: a
done-callback letting SystemExit through (found by reviewer r19: the runs left were never dropped,
and a close without a timeout waited for good), or the pool refusing a run handed on from a
completion thread. A close that may wait for good runs in a process of its own (own_process.py),
whose timeout is the hang guard."""
from __future__ import annotations

import logging
import threading

import pytest

from aclserve.runtime import Engine

from tests.runtime.own_process import run_script
from tests.tiny_models import affine_request

A_CALLBACK_EXITS = """
import json, sys, threading
from aclserve.acl.cpu import faults
from aclserve.runtime import Engine
from tests.tiny_models import affine_request
engine = Engine(device="cpu")
model = engine.load(sys.argv[1], slots=1, retry=False, warmup=False)  # (one run out at a time)
gate = threading.Event()
failing = faults.inject("execute", nth=1, hold=gate, code=507011)  # counts every execute from here
call = model.submit(affine_request(20))  # ten runs of two rows

def exits(_):
    raise SystemExit("a done-callback exits")
call.add_done_callback(exits)  # (before the failed run answers it: the device holds that run)
gate.set()
model.close()  # (no timeout: it waits for the call's runs)
print(json.dumps({"answer": repr(call.exception()), "runs": failing.seen}))
engine.close()
"""


def test_a_done_callback_letting_system_exit_through_still_drops_the_runs_left(affine_om):
    """concurrent.futures lets a callback's BaseException through the answer: the runs not handed
    on were dropped after it, so never, and the call stayed open with no run out."""
    said, stderr = run_script(A_CALLBACK_EXITS, affine_om(batch="1,2"), timeout=60)
    assert "507011" in said["answer"] and said["runs"] == 1, said
    assert stderr.count("affine: a done-callback failed") == 1, stderr[-3000:]


def test_a_run_the_pool_refuses_on_a_completion_thread_answers_the_call_and_blames_no_done_callback(
        affine_om, caplog):
    """A run handed on as the one before came back (a completion thread) that the pool refuses:
    the error answered the call and was raised on, which the pool's listener logged as "a
    done-callback failed" with its traceback, a second report blaming what did not fail."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(batch="1,2"), slots=1, warmup=False)  # (one run out at a time)
        pool_submit, handed = model.pool.submit, []

        def third_refused(batch):
            handed.append(threading.current_thread())
            if len(handed) == 3:
                raise RuntimeError("the pool refuses the third run")
            pool_submit(batch)
        model.pool.submit = third_refused
        call = model.submit(affine_request(20))  # ten runs of two rows
        with pytest.raises(RuntimeError, match="the pool refuses the third run"):
            call.result(timeout=60)
        model.close()  # (no timeout: it waits for the call's runs)
    assert len(handed) == 3 and handed[2] is not threading.main_thread(), handed
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


CTRL_C_AS_THE_POOL_QUEUES_A_RUN = """
import json, signal, sys, threading, time
from aclserve.acl.cpu import faults
from aclserve.runtime import Engine, teardown
from tests.hung_device import let_go
from tests.tiny_models import affine_request
engine = Engine(device="cpu")
model = engine.load(sys.argv[1], slots=1, warmup=False)  # (one run out at a time)
gate = threading.Event()
held = faults.inject("execute", nth=1, hold=gate, code=0)  # counts every execute from here
guard = threading.Timer(60, gate.set)  # a hang guard: a close that waits for the device waits for it
guard.daemon = True
guard.start()
pool_submit = model.pool.submit

def ctrl_c_once_queued(batch):
    pool_submit(batch)
    if threading.current_thread() is threading.main_thread():  # (the call's first run: submit())
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C landing just after the pool took the run
model.pool.submit = ctrl_c_once_queued

def let_go_once_the_close_waits_for_the_call(waited):
    \"\"\"Release the held run once the main thread waits in OpenCalls.left for the call's runs.\"\"\"
    while not gate.is_set():
        names, frame = [], sys._current_frames()[threading.main_thread().ident]
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if names[:3] == ["wait", "wait_for", "left"]:  # (Condition.wait_for waits only while calls are open)
            waited.append(True)
            gate.set()
        time.sleep(0.005)

interrupted, waited = False, []
try:
    model.submit(affine_request(20))  # ten runs of two rows
except KeyboardInterrupt:
    interrupted = True
held.entered.wait(60)
threading.Thread(target=let_go_once_the_close_waits_for_the_call, args=(waited,), daemon=True).start()
engine.close()  # (no timeout: it waits for the runs of the calls taken)
abandoned = teardown.held()
let_go(gate)
print(json.dumps({"interrupted": interrupted, "the close waited for the run": bool(waited), "abandoned": abandoned,
                  "runs": held.seen}))
"""


def test_ctrl_c_just_after_the_pool_queued_a_run_leaves_it_counted_out(affine_om):
    """The interrupt came through pool.submit, and the call took the run it had just queued for
    one that would never run: counted back, a close did not wait for it and left the device
    running it (abandoned past reset_timeout_ms). Now Ctrl-C is held back while the call is taken
    and its first runs handed on (interrupts.py), then raised: the call is given up, its runs not
    handed on dropped, and the one out waited for."""
    said, _ = run_script(CTRL_C_AS_THE_POOL_QUEUES_A_RUN, affine_om(batch="1,2"), timeout=100)
    assert said == {"interrupted": True, "the close waited for the run": True, "abandoned": 0, "runs": 1}, said
