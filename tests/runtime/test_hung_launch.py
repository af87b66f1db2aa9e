"""A close whose instance's launcher thread is still inside a launch at the deadline (a hung
pack here; a hung memcpy_async or execute_async call on a device is the same to the instance):
every batch it held, and every one queued behind it, is answered once; the instance is
abandoned, not freed under the launcher; the launcher hands nothing on when it comes back; the
device is not reset nor ACL finalized under it. The pack is held by the test until it ends;
nothing asserts a duration."""
from __future__ import annotations

import collections
import threading
import time

import pytest

from aclserve.errors import ExecutionFailed
from aclserve.runtime import AclRuntime, open_pool, teardown
from aclserve.runtime.batch import Batch

from tests.hung_device import HeldRows, let_go
from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


class Answers:
    """The pool's listener: how many times each batch was answered."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count: collections.Counter[int] = collections.Counter()

    def batch_done(self, batch: Batch) -> None:
        with self.lock:
            self.count[id(batch)] += 1

    def slot_free(self) -> None:
        pass


def held_request(gate: threading.Event) -> tuple[dict, HeldRows]:
    request = affine_request(1)
    held = HeldRows(request["x"], gate)
    return {"x": held, "idx": request["idx"]}, held


def test_a_close_answers_the_batches_a_hung_launcher_holds_and_abandons_the_instance(affine_om, caplog):
    rt = AclRuntime(device="cpu").start()
    gate = threading.Event()
    pool = open_pool(rt, affine_om(), "affine", slots=2, execution_timeout_ms=600_000)
    answers = Answers()
    pool.attach(answers)
    instance = pool.instances[0]
    launcher = instance._launcher.thread
    try:
        request, held = held_request(gate)
        batches = [Batch([request], 1, 1)]
        pool.submit(batches[0])
        assert held.entered.wait(30)  # the launcher is packing it, and stays there
        batches.append(Batch([affine_request(1, 1)], 1, 1))  # the second slot: queued behind it
        batches.append(Batch([affine_request(1, 2)], 1, 1))  # no slot: waits in the pool
        for batch in batches[1:]:
            pool.submit(batch)
        pool.close(deadline=time.monotonic() + 0.2)
        assert [answers.count[id(b)] for b in batches] == [1, 1, 1]
        assert all(isinstance(b.error, ExecutionFailed) for b in batches)
        assert teardown.held() == 1 and instance.context and instance.slots  # nothing freed under it
        assert launcher.is_alive() and not gate.is_set()
        rt.close()  # the launcher is still inside the launch: no reset, no finalize
        assert "device 0 not reset" in caplog.text and "ACL not finalized" in caplog.text
        let_go(gate)  # the launcher comes back, hands nothing on, ends; then the instance is freed
        launcher.join(30)  # a hang guard
        assert not launcher.is_alive() and not instance.context
        assert [answers.count[id(b)] for b in batches] == [1, 1, 1]  # none answered twice
    finally:
        let_go(gate)
        pool.close()
        rt.close()
    AclRuntime(device="cpu").start().close()  # now the device is reset and ACL finalized
