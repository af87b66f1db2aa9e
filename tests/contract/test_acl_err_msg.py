"""acl.get_recent_err_msg on the CPU runtime: what a run ONNX Runtime fails says of it, in the
thread whose call returns the failure, and the code it returns (acl/cpu/_ort_failures.py): an OM
whose graph computes other output shapes than its header declares at a gear is refused as GE
refuses a run's parameters (145000), a model failing on its data is a device's 507011."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.acl import constants as C

from .conftest import LoadedModel, write_cpu_om

CAPPED = ("the model's graph computes output 'y' as [2, 3] at batch 4, where its OM declares [4, 3]: the OM's "
          "header and its graph disagree (compiled for a batch size it does not serve)")


@pytest.fixture
def capped(acl, ctx, tmp_path, cpu_only):
    """y = x[:2] (a Slice of dimension 0) in a CPU OM declaring gears 1,2,4 and y [N, 3]: what the
    compile wrote when its test runs took batches 1 and 2 only."""
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], "capped",
                              [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, ["n", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    loaded = LoadedModel(acl, write_cpu_om(tmp_path / "capped.om", model, [1, 2, 4]))
    yield loaded
    loaded.close()


def _at_gear(acl, m, gear: int) -> None:
    m.write_input(0, np.ones((gear, 3), np.float32))
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, 1, gear) == 0


def test_a_run_whose_graph_does_not_compute_its_headers_shapes_is_refused_saying_so(acl, capped):
    """Such an OM's warm-up at gear 4 failed with 507011, said as a device fault (its reason in
    the CPU runtime's log only), and its load was retried for good (found by a tester)."""
    m = capped
    assert acl.get_recent_err_msg() is None
    _at_gear(acl, m, 2)
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0  # (a gear it serves)
    _at_gear(acl, m, 4)
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
    assert acl.get_recent_err_msg() == CAPPED
    assert acl.get_recent_err_msg() is None  # (cleared once read)
    said = {}
    thread = threading.Thread(target=lambda: said.update(other=acl.get_recent_err_msg()))
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
    thread.start()
    thread.join()
    assert said == {"other": None}  # (the thread's own: another's call failed)
    assert acl.get_recent_err_msg() == CAPPED


def test_an_async_run_says_why_to_the_thread_whose_synchronize_returns_its_failure(acl, capped):
    m = capped
    _at_gear(acl, m, 4)
    stream, _ = acl.rt.create_stream()
    stopping, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    try:
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.get_recent_err_msg() == CAPPED
        assert acl.rt.synchronize_stream(stream) == 0 and acl.get_recent_err_msg() is None
        # in stop-on-failure mode (the server's) an event's synchronize returns it, and says it
        assert acl.rt.set_stream_failure_mode(stopping, C.ACL_STOP_ON_FAILURE) == 0
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stopping) == 0
        assert acl.rt.record_event(event, stopping) == 0
        assert acl.rt.synchronize_event(event) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.get_recent_err_msg() == CAPPED
    finally:
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(stopping) == 0
        assert acl.rt.destroy_stream(stream) == 0


def test_a_model_failing_on_its_data_is_a_device_fault_saying_onnx_runtimes_reason(acl, ctx, tmp_path, cpu_only):
    """An integer division by its input, on zeros: 507011, as a device's (its AI Core says no
    more), with ONNX Runtime's reason, which the server's load failure shows."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["x", "x"], ["y"])], "idiv",
                              [vi("x", TensorProto.INT32, ["n", 2])], [vi("y", TensorProto.INT32, ["n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    m = LoadedModel(acl, write_cpu_om(tmp_path / "idiv.om", model, [1, 2]))
    try:
        m.write_input(0, np.zeros((1, 2), np.int32))
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, 1, 1) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
        said = acl.get_recent_err_msg()
        assert said.startswith("the model failed in ONNX Runtime: ") and "Integer division by zero" in said, said
    finally:
        m.close()


def test_a_failure_that_says_nothing_carries_no_older_message(acl, capped, clean_faults):
    """A synchronous execute that fails saying nothing (an injected fault) stops its context
    without the message an earlier failure of the thread left unread: a synchronize then says
    nothing, as the failure it returns said nothing."""
    from aclserve.acl.cpu import faults
    m = capped
    _at_gear(acl, m, 4)
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID  # (left unread)
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.rt.set_stream_failure_mode(stream, C.ACL_STOP_ON_FAILURE) == 0
        faults.inject("execute", count=1, code=C.ACL_ERROR_RT_MODEL_EXECUTE)
        _at_gear(acl, m, 2)
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.get_recent_err_msg() == CAPPED  # (the thread's own, unread until now)
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.get_recent_err_msg() is None
    finally:
        assert acl.rt.destroy_stream(stream) == 0


def test_an_injected_fault_that_says_gives_a_device_s_words_which_change_at_every_fault(acl, capped, clean_faults):
    """`says`: a run failed by an injected fault says what CANN's runtime says of a task the device
    failed (where it said nothing), its time and task id changing from one fault to the next as a
    device's do; the words are the same but for those numbers (repository/retry.py same_words)."""
    import os

    from aclserve.acl.cpu import faults
    from aclserve.repository.retry import same_words
    m = capped
    _at_gear(acl, m, 2)
    faults.inject("execute", count=2, says=True)
    said = []
    for _ in range(2):
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
        said.append(acl.get_recent_err_msg())
    assert said[0].startswith(f"EZ9999: Inner Error! EZ9999: [PID: {os.getpid()}] 20") and "task_id=" in said[0], said
    assert said[0] != said[1] and same_words(said[0]) == same_words(said[1]), said
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0 and acl.get_recent_err_msg() is None
    faults.inject("execute", count=1)  # (without `says`: nothing said, as before)
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
    assert acl.get_recent_err_msg() is None
