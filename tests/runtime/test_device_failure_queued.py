"""Batches queued on an instance's launcher when its device is found failed as a whole.

They were launched there all the same: the device refused them at once (one "could not launch a
batch" ERROR line each), and a model with an instance on a healthy device failed them rather
than run them there. Now the launcher hands them back to the pool unlaunched, as the batches not
yet given to an instance are treated: run on a healthy device's instance, or answered at once with
DeviceFailed naming the model. Two CPU devices, the device failed by the CPU runtime's fault
injection; in a process of its own (the device stays failed until every user lets go of it)."""
from __future__ import annotations

from .own_process import run_script

_QUEUED_BEHIND_A_LAUNCH = """
import json, logging, sys, threading
import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import AclRuntime
from aclserve.runtime.builder import open_pool
from aclserve.runtime.futures import BatchFutures
from tests.tiny_models import affine_request

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")


def outcome(future):
    try:
        return f"answered by {future.result(timeout=60).instance}"
    except aclserve.ExecutionFailed as e:
        return f"{type(e).__name__}: {e}"


with AclRuntime(device="cpu") as runtime:
    path = sys.argv[1]
    # lane 0 on device 1, lane 1 on device 0; retry=False: a batch that fails on the device is not run again
    spread = BatchFutures(open_pool(runtime, path, "spread", instances=2, devices=(1, 0), retry=False))
    alone = BatchFutures(open_pool(runtime, path, "alone", devices=(1,)))
    finder = BatchFutures(open_pool(runtime, path, "finder", devices=(1,)))
    gate, calls = threading.Event(), {}
    for model in (spread, alone):
        held = faults.inject("execute_call", nth=1, hold=gate, model_id=model.pool.instances[0].model.model_id)
        first = model.submit([affine_request(1)], gear=1, lane=0)  # its launcher held inside execute_async
        assert held.entered.wait(30)
        calls[model.pool.name] = [first, model.submit([affine_request(1, 5)], gear=1, lane=0)]  # queued behind
    faults.inject("execute", nth=1, code=507054, device=True, model_id=finder.pool.instances[0].model.model_id)
    found = outcome(finder.submit([affine_request(1)], gear=1))  # device 1 found failed (probed) before it is answered
    gate.set()
    out = {name: [outcome(call) for call in pair] for name, pair in calls.items()}
    out["found"] = found
    for model in (spread, alone, finder):
        model.pool.close()
print(json.dumps(out))
"""


def test_batches_queued_on_a_launcher_when_its_device_failed_as_a_whole_are_not_launched(affine_om):
    out, stderr = run_script(_QUEUED_BEHIND_A_LAUNCH, affine_om(), devices=2)
    whole = "device 1 failed as a whole (507054: HBM multi-bit ECC error)"
    assert out["found"].startswith("DeviceFailed: batch of 1 row (gear 1) failed on device 1, instance finder#0"), out
    # the queued one: run on the healthy device (it failed on device 1 before: no re-run with retry=False),
    # or answered at once naming the model (it named only the instance its launch failed on)
    assert out["spread"][1] == "answered by spread#1", (out, stderr[-3000:])
    assert out["alone"][1] == (f"DeviceFailed: model alone: {whole}: nothing runs on it until it is reset, which "
                               f"takes a restart of the process"), out
    # each first batch was inside its launch call as the failure was found: the device refused it, and it only
    for name in ("spread", "alone"):
        assert out[name][0].startswith(f"DeviceFailed: batch of 1 row (gear 1) failed on device 1, instance "
                                       f"{name}#0"), out
        refused = [line for line in stderr.splitlines() if f"{name}#0: could not launch a batch" in line]
        assert len(refused) == 1, stderr[-3000:]  # (two before: the queued one was launched, and refused)
        assert f"{name}#0: 1 queued batch(es) not launched: device 1 failed as a whole; handed back to the pool" \
            in stderr, stderr[-3000:]
