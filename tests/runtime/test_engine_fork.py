"""An Engine in a forked child: its pool's threads and ACL state stayed in the parent, so every
call there raises at once instead of waiting for good (runtime/engine_process.py)."""
from __future__ import annotations

import multiprocessing

from aclserve.runtime import Engine

from tests.runtime.own_process import run_script
from tests.tiny_models import affine_request

CHILD_BOUND_S = 60  # a hang guard: the child answers at once, or the bug is back


def _calls_in_child(engine, model, sender) -> None:
    said = {}
    for what, call in [("infer", lambda: model.infer(affine_request(1))),
                       ("submit", lambda: model.submit(affine_request(1))),
                       ("load", lambda: engine.load("any.om")),
                       ("model close", model.close), ("engine close", engine.close)]:
        try:
            call()
            said[what] = "no error"
        except Exception as e:  # (reported to the parent, which asserts)
            said[what] = f"{type(e).__name__}: {e}"
    sender.send(said)


def test_every_call_in_a_forked_child_raises_at_once_naming_the_fork(affine_om):
    fork = multiprocessing.get_context("fork")
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        receiver, sender = fork.Pipe(duplex=False)
        child = fork.Process(target=_calls_in_child, args=(engine, model, sender))
        child.start()
        child.join(CHILD_BOUND_S)
        if child.is_alive():
            child.kill()
            child.join()
            raise AssertionError(f"the forked child's Engine calls did not return within {CHILD_BOUND_S} s")
        said = receiver.recv()
        assert child.exitcode == 0
        for what, message in said.items():
            assert message.startswith("RuntimeError: this Engine was created in process "), (what, message)
            assert "ACL state does not survive fork: create a new Engine in the child" in message, (what, message)
        # the parent's engine is untouched by the child's attempts
        assert model.infer(affine_request(2))["s"].shape[0] == 2


FILL_THEN_FORK = """
import json, os, sys
import aclserve
engine = aclserve.Engine(device="cpu")
loaded = 0
while loaded < 100:  # the parent fills the device
    try:
        engine.load(sys.argv[1], name=f"parent{loaded}", warmup=False)
    except aclserve.LoadError:
        break
    loaded += 1
pid = os.fork()
if pid == 0:
    try:
        with aclserve.Engine(device="cpu") as child_engine:
            for k in range(loaded):
                child_engine.load(sys.argv[1], name=f"child{k}", warmup=False)
    except BaseException as e:
        print(f"child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
engine.close()
print(json.dumps({"loaded": loaded, "child_exit": os.waitstatus_to_exitcode(status)}))
"""


def test_a_new_engine_in_a_forked_child_has_the_device_to_itself(affine_om):
    """The CPU runtime's state (its memory ledger, contexts, set_device counts) and the ACL user
    count came through fork(): a new Engine in the child found the device filled by the parent's
    models (found by tester t46). A device's driver state does not survive fork: the child starts
    afresh, and what fitted in the parent fits in the child."""
    said, stderr = run_script(FILL_THEN_FORK, affine_om(), ACLSERVE_CPU_DEVICE_MEMORY="20000")
    assert said["loaded"] >= 2, said  # (the device was filled, not refused at once)
    assert said["child_exit"] == 0, stderr[-2000:]
