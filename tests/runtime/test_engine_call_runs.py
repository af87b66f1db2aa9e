"""An Engine call's runs counted out and back whatever raises while they are handed on: a
done-callback letting SystemExit through (found by reviewer r19: the runs left were never dropped,
and a close without a timeout waited for good). Each in a process of its own (own_process.py):
a close that waits for good is ended by the process's timeout, a hang guard."""
from __future__ import annotations

from tests.runtime.own_process import run_script

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
