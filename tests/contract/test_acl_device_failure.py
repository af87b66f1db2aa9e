"""A fault that fails the whole device (faults.py `device`), as an HBM multi-bit ECC error does
(hicann/runtime ContextManage::SetGlobalFailureErr): every task submitted in any context of the
device fails with its code, one made later included, the work a stream still held fails with it,
memory calls still work, and only the device's count back at 0 (no context left, reset_device for
each set_device) clears it. Run in a process of its own: a failed device would stay failed for
the other tests of this one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from aclserve.acl.cpu import faults

from tests import REPO

ECC = 507054  # ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR

_SCRIPT = textwrap.dedent("""
    import json, sys, threading
    import numpy as np
    from aclserve.acl import cpu as acl
    from aclserve.acl.cpu import faults
    from tests.contract.conftest import IN_FEATURES, LoadedModel
    H2D, D2D = 1, 3
    path = sys.argv[1]
    out = {}
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx1, _ = acl.rt.create_context(0)
    first = LoadedModel(acl, path)  # (loaded under ctx1: executed under it)
    stream1, _ = acl.rt.create_stream()
    ctx2, _ = acl.rt.create_context(0)
    second = LoadedModel(acl, path)
    stream2, _ = acl.rt.create_stream()
    block, _ = acl.rt.malloc_host(128)
    host = (block + 63) & ~63  # (on a board, ACLSERVE_CPU_RUN_MODE=device, malloc_host is not 64-byte aligned)
    dev, _ = acl.rt.malloc(128, 2)
    for model in (first, second):
        model.write_input(0, np.ones((1, IN_FEATURES), np.float32))
        acl.mdl.set_dynamic_batch_size(model.model_id, model.inputs, 1, 1)

    # ctx2's stream: a copy held while the device fails, another queued behind it (work in flight)
    gate = threading.Event()
    held = faults.inject("memcpy", nth=1, hold=gate)
    out["queued"] = [acl.rt.memcpy_async(dev, 128, host, 64, H2D, stream2),
                     acl.rt.memcpy_async(dev + 64, 64, host, 64, H2D, stream2)]
    held.entered.wait(30)

    acl.rt.set_context(ctx1)
    faults.inject("execute", nth=1, code=%(code)d, device=True)
    out["failing"] = [acl.mdl.execute_async(first.model_id, first.inputs, first.outputs, stream1),
                      acl.rt.synchronize_stream(stream1)]
    gate.set()

    acl.rt.set_context(ctx2)  # another context of the device
    out["in_flight"] = acl.rt.synchronize_stream(stream2)
    event, _ = acl.rt.create_event()
    out["ctx2"] = [acl.rt.memcpy_async(dev, 128, host, 64, H2D, stream2),
                   acl.mdl.execute_async(second.model_id, second.inputs, second.outputs, stream2),
                   acl.mdl.execute(second.model_id, second.inputs, second.outputs),
                   acl.rt.record_event(event, stream2),
                   acl.rt.memset_async(dev, 128, 0, 64, stream2)]
    ptr, ret = acl.rt.malloc(64, 2)
    out["still"] = [ret, acl.rt.memcpy(dev, 128, host, 64, H2D), acl.rt.free(ptr)]
    acl.rt.destroy_event(event)

    ctx3, _ = acl.rt.create_context(0)  # made after the failure: no escape
    stream3, _ = acl.rt.create_stream()
    out["ctx3"] = [acl.rt.memcpy_async(dev, 128, host, 64, H2D, stream3),
                   acl.rt.memcpy_async(dev + 64, 64, dev, 64, D2D, 0)]

    # let go of everything but the set_device: still failed (its count is 1)
    acl.rt.destroy_stream(stream3)
    acl.rt.destroy_context(ctx3)
    acl.rt.set_context(ctx2)
    second.close()
    acl.rt.destroy_stream(stream2)
    acl.rt.destroy_context(ctx2)
    acl.rt.set_context(ctx1)
    first.close()
    acl.rt.destroy_stream(stream1)
    acl.rt.destroy_context(ctx1)
    acl.rt.set_device(0)  # (binds the default context: count 2)
    out["count_2"] = acl.rt.memcpy_async(dev, 128, host, 64, H2D, 0)
    acl.rt.reset_device(0)
    out["count_1"] = acl.rt.memcpy_async(dev, 128, host, 64, H2D, 0)
    acl.rt.reset_device(0)  # count 0: the device's failure goes with it

    acl.rt.set_device(0)
    ctx4, _ = acl.rt.create_context(0)
    again = LoadedModel(acl, path)
    again.write_input(0, np.ones((1, IN_FEATURES), np.float32))
    acl.mdl.set_dynamic_batch_size(again.model_id, again.inputs, 1, 1)
    stream4, _ = acl.rt.create_stream()
    out["after_reset"] = [acl.rt.memcpy_async(dev, 128, host, 64, H2D, stream4),
                          acl.mdl.execute_async(again.model_id, again.inputs, again.outputs, stream4),
                          acl.rt.synchronize_stream(stream4)]
    print(json.dumps(out))
""")


def test_a_device_fault_fails_every_context_until_the_device_is_let_go_of(mlp_om):
    env = dict(os.environ, ACLSERVE_DEVICE="cpu", PYTHONPATH=str(REPO))
    env.pop("ACLSERVE_CPU_FAULTS", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT % {"code": ECC}, mlp_om[0]], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["queued"] == [0, 0]
    assert out["failing"] == [0, ECC]  # the execution that failed the device, on its own stream
    assert out["in_flight"] == ECC  # the copy queued behind the held one ran after the failure
    assert out["ctx2"] == [ECC] * 5  # every submission of another context
    assert out["still"] == [0, 0, 0]  # malloc, the synchronous memcpy and free still work
    assert out["ctx3"] == [ECC, ECC]  # a context made later, its own stream and its default one
    assert out["count_2"] == ECC and out["count_1"] == ECC  # not while set_device holds it
    assert out["after_reset"] == [0, 0, 0]  # a clean device once its count was back at 0


def test_device_is_a_fault_spec_key_for_executes_and_copies():
    assert faults.parse("execute:nth=5,code=507054,device=1") == [
        {"kind": "execute", "nth": 5, "code": 507054, "device": 1}]
    for spec, fragment in (("execute:device=2", "device must be 0 or 1"),
                           ("load:device=1", "device=1 is for the kinds execute and memcpy"),
                           ("memcpy:code=507899,device=1", "device=1 needs the code of a device failed as a whole"),
                           # (it said "got None", Python's word for a code not given)
                           ("execute:device=1", "507054, given none (code=...)")):
        try:
            faults.parse(spec)
        except ValueError as e:
            assert fragment in str(e)
        else:
            raise AssertionError(f"{spec} was taken")


def test_every_code_of_a_whole_device_failure_is_said_by_its_meaning():
    """A device failed as a whole logs its code's meaning (device_health.py): 107022, a device task
    abort, said "unknown ACL error" (a tester, t97)."""
    from aclserve.acl import constants as C
    for code in C.WHOLE_DEVICE_FAILURES:
        assert C.error_meaning(code) != "unknown ACL error", code
