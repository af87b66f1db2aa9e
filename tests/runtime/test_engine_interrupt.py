"""Ctrl-C in Engine.close() or load(): it came through only once the close had waited for the device,
up to reset_timeout_ms (found by tester t29: 6 to 10 s late), and the calls a close had not
answered stayed unanswered. Now the close is hurried (what the device still runs is abandoned,
as a close's timeout does) and the KeyboardInterrupt raised once it is done. Here the device
holds a run, and every close that waits for it waits for good (a 600 s reset timeout): the
KeyboardInterrupt must come while the device still holds it. Each in a process of its own
(own_process.py): a real SIGINT, sent to the main thread once it waits."""
from __future__ import annotations

from tests.runtime.own_process import run_script

WAITING_FOR = """
import json, signal, sys, threading, time
from aclserve.acl.cpu import faults
from aclserve.runtime import teardown
from tests.hung_device import let_go

heard = threading.Event()

def on_sigint(signum, frame):
    heard.set()
    signal.default_int_handler(signum, frame)

signal.signal(signal.SIGINT, on_sigint)

def ctrl_c_once_waiting(where):
    \"\"\"SIGINT to the main thread once it waits in `where` (a function of the runtime), sent again
    every 5 s until its handler has run: one landing after the wait released the GIL and before its
    syscall blocked is heard only when the wait ends (CPython's race; once, on a loaded machine, the
    60 s guard's). Signals pending together run the handler once: one KeyboardInterrupt.\"\"\"
    def send():
        while not any(f.f_code.co_name == where for f in frames(sys._current_frames()[threading.main_thread().ident])):
            time.sleep(0.005)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        while not heard.wait(5):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    threading.Thread(target=send, daemon=True).start()

def frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back

gate = threading.Event()
held = faults.inject("execute", nth=1, hold=gate, code=0)
guard = threading.Timer(60, gate.set)  # a hang guard: a close that waits for the device waits for it
guard.daemon = True
guard.start()
"""

CTRL_C_IN_CLOSE = WAITING_FOR + """
import aclserve
from tests.tiny_models import affine_request
engine = aclserve.Engine(device="cpu")
model = engine.load(sys.argv[1], warmup=False)
for instance in model.pool.instances:
    instance.reset_timeout_ms = 600_000
calls = [model.submit(affine_request(1)) for _ in range(3)]
held.entered.wait(60)
ctrl_c_once_waiting("left")  # (OpenCalls.left: the close waits for the calls)
try:
    engine.close()
except KeyboardInterrupt:
    interrupted = {"device still held": not gate.is_set(), "abandoned": teardown.held()}
answers = [repr(call.exception(timeout=0)) for call in calls]
let_go(gate)
print(json.dumps({"interrupted": interrupted, "answers": answers, "closed": engine.closed}))
"""


def test_ctrl_c_in_a_close_fails_the_calls_left_and_leaves_the_device_at_once(affine_om):
    said, _ = run_script(CTRL_C_IN_CLOSE, affine_om())
    assert said["interrupted"] == {"device still held": True, "abandoned": 1}, said
    closed = ("Closed('model affine was closed before the call was answered (the close was interrupted)')")
    assert said["answers"] == [closed] * 3 and said["closed"], said


CTRL_C_IN_LOAD = WAITING_FOR + """
import functools
import numpy as np
import aclserve
from aclserve.runtime import builder, engine as engine_module
engine_module.open_pool = functools.partial(builder.open_pool, reset_timeout_ms=600_000)
engine = aclserve.Engine(device="cpu")
ctrl_c_once_waiting("_run_alone")  # (the warm-up waits for its run)
try:
    engine.load(sys.argv[1])
except KeyboardInterrupt:
    interrupted = {"device still held": not gate.is_set(), "abandoned": teardown.held()}
let_go(gate)
model = engine.load(sys.argv[1], name="again")
usable = model.infer({"x": np.zeros((1, 8), np.float32), "idx": np.zeros((1, 3), np.int64)})["s"].shape
engine.close()
print(json.dumps({"interrupted": interrupted, "models": [m.name for m in engine.models], "usable": usable}))
"""


def test_ctrl_c_in_a_load_closes_what_it_opened_without_waiting_for_the_device(affine_om):
    said, _ = run_script(CTRL_C_IN_LOAD, affine_om())
    assert said == {"interrupted": {"device still held": True, "abandoned": 1}, "models": [], "usable": [1, 3]}, said


CTRL_C_IN_INFER = WAITING_FOR + """
import aclserve
from tests.tiny_models import affine_request
engine = aclserve.Engine(device="cpu")
model = engine.load(sys.argv[1], warmup=False)  # (the held execute is the call's first run)
ctrl_c_once_waiting("result")  # (Future.result: infer waits for its call)
interrupted = False
try:
    model.infer(affine_request(200))
except KeyboardInterrupt:
    interrupted = True
gate.set()
engine.close()  # (waits for the runs the call launched)
print(json.dumps({"interrupted": interrupted, "runs": held.seen}))
"""


def test_ctrl_c_in_an_infer_drops_the_runs_of_its_call_not_launched_yet(affine_om):
    """A call of 100 runs (gears of at most 2 rows) interrupted at its first ran all 100 (tester
    t46): now only the two launched, one per slot of its instance; the close waits for those."""
    said, _ = run_script(CTRL_C_IN_INFER, affine_om(batch="1,2"))
    assert said == {"interrupted": True, "runs": 2}, said
