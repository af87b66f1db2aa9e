"""A launcher thread stuck inside a launch (a hung pack here; a hung memcpy_async or
execute_async call on a device is the same to the instance).

A close whose instance's launcher thread is still inside a launch at the deadline (a hung
pack here; a hung memcpy_async or execute_async call on a device is the same to the instance):
every batch it held, and every one queued behind it, is answered once; the instance is
abandoned, not freed under the launcher; the launcher hands nothing on when it comes back; the
device is not reset nor ACL finalized under it. The pack is held by the test until it ends;
nothing asserts a duration."""
from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pytest

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults
from aclserve.errors import DeviceTimeout, ExecutionFailed
from aclserve.runtime import AclRuntime, open_pool, teardown
from aclserve.runtime.batch import Batch

from tests.hung_device import HeldRows, let_go, short_timeout_only_on
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


def answered_pool(om_path: str, execution_timeout_ms: int):
    """(runtime, gate, a pool of two slots on it, its Answers listener)."""
    rt = AclRuntime(device="cpu").start()
    pool = open_pool(rt, om_path, "affine", slots=2, execution_timeout_ms=execution_timeout_ms)
    answers = Answers()
    pool.attach(answers)
    return rt, threading.Event(), pool, answers


def test_a_close_answers_the_batches_a_hung_launcher_holds_and_abandons_the_instance(affine_om, caplog):
    rt, gate, pool, answers = answered_pool(affine_om(), 600_000)
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


def _answered(answers: Answers, batches: list[Batch]) -> bool:
    """Wait until every batch has been answered (a hang guard: no duration is asserted)."""
    for _ in range(3000):
        with answers.lock:
            if all(answers.count[id(b)] for b in batches):
                return True
        time.sleep(0.01)
    return False


def test_a_launch_call_that_does_not_return_takes_its_instance_out_of_rotation(affine_om, caplog):
    """An execute_async call that blocks in the driver was bounded by nothing while the instance
    served: its batch, and every one behind it, waited until an unload. Past the execution
    timeout the instance now leaves rotation as for a batch the device does not finish: the
    held batch and the one queued behind it fail once with DeviceTimeout, a replacement serves
    the next, and the launcher, let go, hands nothing on."""
    rt, gate, pool, answers = answered_pool(affine_om(), 200)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    first = pool.instances[0]
    try:
        stuck = faults.inject("execute_call", nth=1, hold=gate)
        batches = [Batch([affine_request(1)], 1, 1)]
        pool.submit(batches[0])
        assert stuck.entered.wait(30)  # the launcher is inside the call, and stays there
        batches.append(Batch([affine_request(1, 1)], 1, 1))  # the second slot: queued behind it
        pool.submit(batches[1])
        assert _answered(answers, batches)
        assert all(isinstance(b.error, DeviceTimeout) for b in batches), [b.error for b in batches]
        assert "did not return within 200 ms" in str(batches[0].error) and first.broken
        after = Batch([affine_request(2, 3)], 2, 2)
        pool.submit(after)  # waits for the rebuilt instance
        assert _answered(answers, [after]) and after.error is None
        np.testing.assert_array_equal(after.outputs[0]["s"], affine_request(2, 3)["idx"] * 2)
        assert pool.instances[0] is not first and pool.rebuilds == 1
        assert pool.fault_counts() == {C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: 1}
        assert "a launch call did not return" in caplog.text
        let_go(gate)  # the old launcher comes back and hands nothing on
        first._launcher.thread.join(30)  # a hang guard
        assert not first._launcher.thread.is_alive()
        assert [answers.count[id(b)] for b in batches + [after]] == [1, 1, 1]
    finally:
        let_go(gate)
        pool.close()
        rt.close()


class _PausingQueue:
    """The launcher's hand-off queue, pausing its thread just after get() returns `pause_on`:
    the moment between taking a batch and marking it as the one being launched."""

    def __init__(self, inner, pause_on):
        self._inner, self._pause_on = inner, pause_on
        self.got, self.go = threading.Event(), threading.Event()

    def put(self, item):
        self._inner.put(item)

    def get_nowait(self):
        return self._inner.get_nowait()

    def get(self, *args, **kwargs):
        item = self._inner.get(*args, **kwargs)
        if item is not None and item[1] is self._pause_on:
            self.got.set()
            self.go.wait(30)
        return item


def test_a_batch_taken_by_the_launcher_as_its_launch_is_abandoned_is_answered(affine_om):
    """The hung launch comes back just as it is abandoned (the completion thread read it as
    overdue, then abandoned it; or a close gave up on it at its deadline), and the launcher has
    already taken the next batch off its queue but not yet marked it as launching: abandon()
    saw neither that batch held nor queued. It was launched and never handed on: its requests
    waited for good. Now the launcher answers it (given up) instead of launching it."""
    rt, gate, pool, answers = answered_pool(affine_om(), 600_000)
    instance = pool.instances[0]
    launcher = instance._launcher
    try:
        request, held = held_request(gate)
        first = Batch([request], 1, 1)
        pool.submit(first)
        assert held.entered.wait(30)  # the launcher is packing it, and stays there
        second = Batch([affine_request(1, 1)], 1, 1)
        paused = _PausingQueue(launcher._queue, second)
        launcher._queue = paused
        pool.submit(second)  # the second slot: queued behind it
        let_go(gate)  # the launch comes back; the launcher hands it on and takes the next
        assert paused.got.wait(30)
        instance.take_out_of_rotation("forced: a launch call past the execution timeout")
        launcher.abandon("forced: a launch call past the execution timeout")
        paused.go.set()
        launcher.thread.join(30)  # a hang guard
        assert _answered(answers, [first, second]), "the batch the launcher had taken was never answered"
        assert answers.count[id(second)] == 1 and isinstance(second.error, DeviceTimeout)
    finally:
        let_go(gate)
        pool.close()
        rt.close()
