"""Review 8 (scheduling and runtime): defects found by an adversarial review, each with its test.
Real parts: the CPU runtime, tiny ONNX models compiled to CPU OMs, fault injection."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import DeviceTimeout, ExecutionFailed
from aclserve.runtime import open_pool
from aclserve.runtime.futures import BatchFutures

from tests.hung_device import short_timeout_only_on
from tests.tiny_models import affine_reference, affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")



def test_a_failed_input_copy_fails_its_batch_instead_of_running_on_stale_rows(runtime, affine_om):
    """A batch launched behind another is copied in on the H2D stream. Its copy's error is
    reported by h2d_end, which nobody waited for: the batch ran on whatever the slot's device
    buffer held (another request's rows) and was answered as a success. Now the instance's
    streams stop on a failure (compat.stop_on_failure): the first batch, whose copy out is not
    run after it, fails as well, and the rebuilt instance serves on."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate)  # keeps the first batch in flight
        first = done.submit([affine_request(1, 1)], 1)
        assert held.entered.wait(30)
        copy = faults.inject("memcpy", nth=1)  # the second batch's first input copy fails
        second = done.submit([affine_request(1, 2)], 1)
        assert copy.entered.wait(30)  # before the first batch copies its outputs out
        gate.set()
        for batch in (first, second):
            with pytest.raises(ExecutionFailed, match="507011"):
                batch.result(timeout=30)
        faults.clear()
        result = done.submit([affine_request(1, 3)], 1).result(timeout=30)  # the instance serves on
        np.testing.assert_allclose(result.outputs[0]["y"], affine_reference(*affine_request(1, 3).values())["y"],
                                   rtol=1e-5, atol=1e-5)
    finally:
        gate.set()
        pool.close()


@pytest.mark.parametrize("copy", [1, 3], ids=["copy-in", "copy-out"])
def test_a_hung_copy_of_a_lone_batch_is_bounded_by_the_execution_timeout(runtime, affine_om, copy):
    """A lone batch (nothing else in flight) used to be copied with synchronous memcpys on the
    launcher and completion threads: a device that hung in one held the batch, and the
    instance, for as long as it hung, whatever execution_timeout_ms said. The affine model has
    two inputs and two outputs: memcpy 1 copies the first input in, 3 the first output out."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, execution_timeout_ms=200)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        held = faults.inject("memcpy", nth=copy, hold=gate)
        with pytest.raises(DeviceTimeout, match="within the model's execution timeout"):
            done.submit([affine_request(1)], 1).result(timeout=30)  # a hang guard: it waited for the gate
        assert held.fired == 1
        # the instance was rebuilt and serves (the hung copy is still held)
        result = done.submit([affine_request(2, 7)], 2).result(timeout=30)
        np.testing.assert_array_equal(result.outputs[0]["s"], affine_reference(*affine_request(2, 7).values())["s"])
    finally:
        gate.set()
        pool.close()


def test_engine_inputs_that_are_not_a_mapping_are_refused_with_what_is_expected(affine_om):
    """model.infer(array) or model.infer([x, idx]) raised "unhashable type: 'numpy.ndarray'",
    model.infer(None) "'NoneType' object is not iterable": nothing saying what was wrong."""
    from aclserve.runtime import Engine
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), warmup=False, retry=False)
        req = affine_request(2)
        for bad in (req["x"], [req["x"], req["idx"]], None):
            with pytest.raises(TypeError, match=r"inputs must be a mapping of input name to array "
                                                r"\(the model takes \['idx', 'x'\]\)"):
                model.infer(bad)
        np.testing.assert_array_equal(model.infer(req)["s"], req["idx"] * 2)


def test_engine_refuses_an_input_a_cast_would_change(affine_om):
    """From the review's notes: a float array given for an INT64 input was cast silently (1.7
    became 1, NaN any integer). Casts within a kind (float64 -> float32, int32 -> int64) stay."""
    from aclserve.runtime import Engine
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), warmup=False, retry=False)
        req = affine_request(2)
        with pytest.raises(ValueError, match="input 'idx' is float64, the model takes int64"):
            model.infer({"x": req["x"], "idx": req["idx"] + 0.7})
        out = model.infer({"x": req["x"].astype(np.float64), "idx": req["idx"].astype(np.int32)})
        np.testing.assert_array_equal(out["s"], req["idx"] * 2)


def test_a_batch_launched_on_an_instance_closed_since_its_slot_was_reserved_is_answered(runtime, affine_om):
    """From the review's notes: the pool may reserve a slot (try_reserve) just before the
    instance's close() queues its launcher's stop marker, then launch behind the marker, where
    nobody answers the batch. Launched after the close, it now fails at once, to the listener."""
    from aclserve.runtime.batch import Batch
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    instance = pool.instances[0]
    answered = []

    class Listener:
        batch_done = staticmethod(answered.append)

        def slot_free(self):
            pass
    try:
        instance.attach(Listener())
        slot = instance.try_reserve()
        instance.close()
        batch = Batch([affine_request(1, 1)], 1, 1)
        instance.launch(slot, batch)
        assert answered == [batch] and isinstance(batch.error, ExecutionFailed) and "closed" in str(batch.error)
    finally:
        pool.close()


@pytest.mark.parametrize("copy", [1, 3], ids=["copy-in", "copy-out"])
def test_a_failed_copy_of_a_lone_batch_fails_it(runtime, affine_om, copy):
    """A lone batch's copies have no events of their own: a failed copy-in is reported by
    exec_start, a failed copy-out by d2h_end. Either fails the batch (never an answer made of
    stale rows), and the instance serves on."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    try:
        faults.inject("memcpy", nth=copy)
        with pytest.raises(ExecutionFailed, match="507011"):
            done.submit([affine_request(1, 1)], 1).result(timeout=30)
        faults.clear()
        result = done.submit([affine_request(1, 2)], 1).result(timeout=30)
        np.testing.assert_allclose(result.outputs[0]["y"], affine_reference(*affine_request(1, 2).values())["y"],
                                   rtol=1e-5, atol=1e-5)
    finally:
        pool.close()
