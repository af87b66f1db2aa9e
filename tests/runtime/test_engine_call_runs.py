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
