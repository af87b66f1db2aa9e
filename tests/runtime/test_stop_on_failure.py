"""An instance whose streams stop on a failed task (compat.stop_on_failure): what its batches in
flight get, what /metrics counts, and the rebuilt instance. Real parts: the CPU runtime (whose
contexts stop as CANN's do), tiny ONNX models compiled to CPU OMs, fault injection."""
from __future__ import annotations

import gc
import logging
import threading
import time
import weakref

import numpy as np
import pytest

from aclserve.acl.cpu import _state, _stream, faults
from aclserve.errors import ExecutionFailed
from aclserve.runtime import open_pool, teardown
from aclserve.runtime.futures import BatchFutures

from tests.tiny_models import affine_reference, affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_stop_fails_the_batches_in_flight_counts_once_and_the_rebuilt_instance_serves(runtime, affine_om, caplog):
    """Batch 1's execution fails while batch 2's launch is inside its execute call: batch 2 is
    refused by the stopped context. Both fail as device failures (500), the stop is counted once
    (it was counted once per refused launch, and a late count was lost at the instance's swap),
    a refused launch is one log line (no traceback), and the stopped instance is freed, not
    abandoned, once the rebuilt one serves."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    try:
        gate1, gate2 = threading.Event(), threading.Event()
        failing = faults.inject("execute", nth=1, hold=gate1, code=507011)
        launching = faults.inject("execute_call", nth=2, hold=gate2)
        old = pool.instances[0]
        first = done.submit([affine_request(1)], 1)
        assert failing.entered.wait(30)
        second = done.submit([affine_request(1, 3)], 1)
        assert launching.entered.wait(30)
        with caplog.at_level(logging.ERROR):
            gate1.set()  # batch 1 fails: the context stops ...
            deadline = time.monotonic() + 30
            while not old.broken and time.monotonic() < deadline:
                time.sleep(0.01)
            gate2.set()  # ... before batch 2's execute call goes on
            for batch in (first, second):
                with pytest.raises(ExecutionFailed, match="failed on device 0"):
                    batch.result(timeout=30)
        faults.clear()
        request = affine_request(2, first_id=5)
        result = done.submit([request], 2).result(timeout=30)  # the rebuilt instance
        np.testing.assert_allclose(result.outputs[0]["y"], affine_reference(**request)["y"], rtol=1e-5, atol=1e-5)
        assert pool.rebuilds == 1
        assert pool.fault_counts() == old.fault_counts() == {507011: 1}
        assert not [r for r in caplog.records if r.exc_info]
        assert "could not launch a batch: acl.mdl.execute_async failed with 507011" in caplog.text
        assert teardown.held() == 0  # the stopped instance was freed (nothing runs on it), not abandoned
    finally:
        gate1.set()
        gate2.set()
        pool.close()


def stop_beside_a_running_execution(done: BatchFutures, gate: threading.Event) -> None:
    """Batch 1's execution runs (held until `gate`) when batch 2's copy in fails: the context
    stops, and both batches fail while batch 1 still runs."""
    running = faults.inject("execute", nth=1, hold=gate)
    first = done.submit([affine_request(1)], 1)
    assert running.entered.wait(30)
    faults.inject("memcpy", nth=1)  # batch 2's copy in, beside batch 1's execution
    second = done.submit([affine_request(1, 3)], 1)
    for batch in (first, second):
        with pytest.raises(ExecutionFailed, match="failed on device 0"):
            batch.result(timeout=30)
    assert not gate.is_set()
    faults.clear()


def test_a_stopped_instance_aborts_its_streams_before_it_frees_what_they_use(runtime, affine_om, caplog):
    """The context stops while the device still runs batch 1, and its streams' synchronize then
    returns at once (CANN checks the context before it waits). The stopped instance's close
    aborts its streams, which waits for that execution, before it frees the slots' memory; then
    the rebuilt instance serves."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        with caplog.at_level(logging.DEBUG, logger="aclserve.acl.cpu"):
            stop_beside_a_running_execution(done, gate)
            threading.Timer(0.3, gate.set).start()  # the abort waits for it
            request = affine_request(2, first_id=5)
            result = done.submit([request], 2).result(timeout=30)  # the rebuilt instance
            deadline = time.monotonic() + 30
            while caplog.text.count(": aborted") < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        np.testing.assert_allclose(result.outputs[0]["y"], affine_reference(**request)["y"], rtol=1e-5, atol=1e-5)
        assert caplog.text.count(": aborted") == 3  # h2d, compute and d2h
        assert gate.is_set()
        assert teardown.held() == 0
    finally:
        gate.set()
        pool.close()


def test_a_stopped_instance_whose_stream_cannot_be_aborted_is_abandoned_until_it_can(runtime, affine_om,
                                                                                     monkeypatch):
    """The abort of the stopped instance's compute stream fails (its task still runs past the
    CPU runtime's abort wait): the instance is abandoned, not freed under that task, and freed
    once the task has ended."""
    monkeypatch.setattr(_stream, "ABORT_WAIT_S", 0.2)
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        stop_beside_a_running_execution(done, gate)
        done.submit([affine_request(2, first_id=5)], 2).result(timeout=30)  # the rebuilt instance serves
        deadline = time.monotonic() + 30
        while teardown.held() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert teardown.held() == 1  # abandoned: its compute stream still runs the held execution
        gate.set()
        deadline = time.monotonic() + 30
        while teardown.held() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert teardown.held() == 0  # freed by the retries once the device let go
    finally:
        gate.set()
        pool.close()


def test_a_pool_closed_while_a_replaced_instance_is_still_being_closed_waits_for_it(runtime, affine_om,
                                                                                    monkeypatch):
    """The rebuild thread closes the instance it replaced after the new one serves (here it
    waits for the abort of a running execution): the pool's close waits for that too, so when it
    returns everything of the pool is freed (it returned with the old instance still open)."""
    monkeypatch.setattr(_stream, "ABORT_WAIT_S", 60.0)  # the abort waits for the gate, however slow the machine
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        old = pool.instances[0]
        stop_beside_a_running_execution(done, gate)
        done.submit([affine_request(2, first_id=5)], 2).result(timeout=30)  # the rebuilt instance
        assert old.context  # still being closed: its abort waits for the held execution
        threading.Timer(0.5, gate.set).start()
        pool.close()
        assert gate.is_set()  # close() returned after the abort, which waited for the gate
        assert old.context == 0  # the replaced instance is freed ...
        assert teardown.held() == 0  # ... not abandoned
    finally:
        gate.set()
        pool.close()


def test_a_replaced_instance_is_let_go_once_closed(runtime, affine_om):
    """The rebuild thread closes the instance it replaced, and nothing holds it after that: the
    first instances stayed in open_pool's undo stack, with everything they refer to, until the
    pool's close (a model serving for months through many rebuilds kept every one it started with)."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    try:
        replaced = weakref.ref(pool.instances[0])
        faults.inject("execute", nth=1)
        with pytest.raises(ExecutionFailed, match="failed on device 0"):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert_let_go(pool, done, replaced)
    finally:
        pool.close()


def test_a_replaced_instance_whose_launch_was_refused_is_let_go_once_closed(runtime, affine_om, caplog):
    """A launch its stopped context refused logged the AclError itself: a handler that keeps its
    records (pytest's) kept the error's traceback, the launcher's frame and so the whole replaced
    instance. The test above took that path now and then (its stream ran the failed execution
    before the launch's next call: 1 run of its file in 3 with a launch a microsecond slower);
    here it is taken each time."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        replaced = weakref.ref(pool.instances[0])
        context = _state.contexts[pool.instances[0].context]
        faults.inject("memcpy", nth=1)  # the batch's first copy in fails: its context stops ...
        held = faults.inject("execute_call", nth=1, hold=gate)  # ... while its launch waits in the execute call
        with caplog.at_level(logging.ERROR):
            batch = done.submit([affine_request(1)], 1)
            assert held.entered.wait(30)
            deadline = time.monotonic() + 30
            while not context.failure and time.monotonic() < deadline:
                time.sleep(0.01)
            gate.set()
            with pytest.raises(ExecutionFailed, match="failed on device 0"):
                batch.result(timeout=30)
        del batch  # (its error, as any caller holding the future has it, refers to the instance)
        assert "could not launch a batch: acl.mdl.execute_async failed with 507011" in caplog.text
        assert_let_go(pool, done, replaced)
    finally:
        gate.set()
        pool.close()


def assert_let_go(pool, done: BatchFutures, replaced: weakref.ref) -> None:
    """The rebuilt instance serves, and once its rebuild thread closed the one it replaced nothing holds that."""
    faults.clear()
    done.submit([affine_request(2, first_id=5)], 2).result(timeout=30)  # the rebuilt instance
    assert pool.rebuilds == 1
    for thread in threading.enumerate():  # its rebuild thread, closing the replaced one
        if thread.name == "affine-rebuild0":
            thread.join(30)
    gc.collect()
    assert replaced() is None
