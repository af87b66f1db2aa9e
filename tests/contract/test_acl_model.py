"""Models executed: execute's rules, host memory in an execution (refused on a host, taken on the
board), results as ONNX Runtime's and the current output dims, one execution of a model at a time,
fault injection."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest
from .conftest import IN_FEATURES, MBATCH, OUT_FEATURES, LoadedModel

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults
from tests import REPO


def _reference(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_execute_rules(acl, loaded_mlp, ctx):
    m = loaded_mlp
    empty = acl.mdl.create_dataset()
    short_ds = acl.mdl.create_dataset()
    x_size = acl.mdl.get_input_size_by_index(m.desc, 0)
    small, _ = acl.rt.malloc(x_size, 0)
    try:
        assert acl.mdl.execute(m.model_id, empty, m.outputs) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.execute(m.model_id, m.inputs, empty) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.execute(999_999, m.inputs, m.outputs) == C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        too_small = acl.create_data_buffer(small, x_size - 65)
        ok_small = acl.create_data_buffer(small, x_size - 64)
        mbatch = acl.mdl.get_dataset_buffer(m.inputs, MBATCH)
        for buf in (too_small, mbatch):
            acl.mdl.add_dataset_buffer(short_ds, buf)
        assert acl.mdl.set_dynamic_batch_size(m.model_id, short_ds, MBATCH, 1) == 0
        assert acl.mdl.execute(m.model_id, short_ds, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.update_data_buffer(too_small, small, x_size - 64) == 0  # within 64 bytes: accepted
        assert acl.mdl.execute(m.model_id, short_ds, m.outputs) == 0
        for buf in (too_small, ok_small):
            acl.destroy_data_buffer(buf)
    finally:
        acl.mdl.destroy_dataset(empty)
        acl.mdl.destroy_dataset(short_ds)
        acl.rt.free(small)


def test_execute_takes_malloc_host_buffers_on_the_board_only(acl, loaded_mlp, mlp_om):
    """aclmdlExecute's buffers are device memory, host memory only in ACL_DEVICE mode (CANN's page;
    pyACL reference, section 5): on a host malloc_host memory is refused (145000), on the board
    (ACLSERVE_CPU_RUN_MODE=device, where aclrtMallocHost gives the device's own memory) an input
    and outputs there run. The CPU runtime refused them on the board too (found by a fidelity
    tester); test_the_board_takes_malloc_host_memory_as_device_memory runs this there."""
    m = loaded_mlp
    on_board = acl.rt.get_run_mode()[0] == C.ACL_DEVICE
    sizes = [acl.mdl.get_input_size_by_index(m.desc, 0)] + [acl.mdl.get_output_size_by_index(m.desc, i)
                                                            for i in (0, 1)]
    hosts = [acl.rt.malloc_host(size)[0] for size in sizes]
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    bufs = [acl.create_data_buffer(ptr, size) for ptr, size in zip(hosts, sizes)]
    x = np.random.default_rng(3).standard_normal((2, IN_FEATURES)).astype(np.float32)
    try:
        for ds, buf in ((ins, bufs[0]), (ins, acl.mdl.get_dataset_buffer(m.inputs, MBATCH)), (outs, bufs[1]),
                        (outs, bufs[2])):
            acl.mdl.add_dataset_buffer(ds, buf)
        assert acl.rt.memcpy(hosts[0], sizes[0], acl.util.bytes_to_ptr(x.tobytes()), x.nbytes,
                             C.ACL_MEMCPY_HOST_TO_HOST) == 0
        assert acl.mdl.set_dynamic_batch_size(m.model_id, ins, MBATCH, 2) == 0
        if not on_board:
            assert acl.mdl.execute(m.model_id, ins, outs) == C.ACL_ERROR_GE_PARAM_INVALID
            return
        assert acl.mdl.execute(m.model_id, ins, outs) == 0
        y, idx = _reference(mlp_om[1], x)
        got = np.frombuffer(acl.util.ptr_to_bytes(hosts[1], y.nbytes), np.float32).reshape(y.shape)
        np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.frombuffer(acl.util.ptr_to_bytes(hosts[2], idx.nbytes), np.int64), idx)
    finally:
        for buf in bufs:
            acl.destroy_data_buffer(buf)
        acl.mdl.destroy_dataset(ins)
        acl.mdl.destroy_dataset(outs)
        for host in hosts:
            acl.rt.free_host(host)


def test_the_board_takes_malloc_host_memory_as_device_memory(cpu_only):
    """The tests of malloc_host memory in an execution and in device-to-device copies, run with the
    CPU runtime presenting a board (ACLSERVE_CPU_RUN_MODE=device: read when ACL starts, so in a
    process of its own), where they check that it is taken as the device's memory."""
    tests = ["tests/contract/test_acl_model.py::test_execute_takes_malloc_host_buffers_on_the_board_only",
             "tests/contract/test_acl_model.py::test_a_gear_input_in_host_memory_is_refused_as_host_memory",
             "tests/contract/test_acl_memory.py::test_device_copies_take_malloc_host_memory_on_the_board_only"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=REPO,
                          env=dict(os.environ, ACLSERVE_CPU_RUN_MODE="device"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-3000:]


def test_a_gear_input_in_host_memory_is_refused_as_host_memory(acl, loaded_mlp, device_buffer, cpu_only):
    """The gear input (ascend_mbatch_shape_data) in malloc_host memory was refused at execute with
    145011, "dynamic input address invalid", before the check that refuses any other input there
    (145000, not inside device memory; found by a fidelity tester): now 145000 too, and
    get_recent_err_msg names the input. One in no memory at all (freed) stays 145011. On the board,
    where malloc_host's memory is the device's, it is set and runs."""
    m = loaded_mlp
    on_board = acl.rt.get_run_mode()[0] == C.ACL_DEVICE
    host, _ = acl.rt.malloc_host(8)
    freed = device_buffer(8)
    ds, freed_ds = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    gear_bufs = [acl.create_data_buffer(host, 8), acl.create_data_buffer(freed, 8)]
    try:
        for dataset, gear_buf in ((ds, gear_bufs[0]), (freed_ds, gear_bufs[1])):
            acl.mdl.add_dataset_buffer(dataset, acl.mdl.get_dataset_buffer(m.inputs, 0))
            acl.mdl.add_dataset_buffer(dataset, gear_buf)
        if on_board:
            assert acl.mdl.set_dynamic_batch_size(m.model_id, ds, MBATCH, 2) == 0
            assert acl.mdl.execute(m.model_id, ds, m.outputs) == 0
        else:  # the gear is recorded on the dataset before the write into the buffer is refused
            assert acl.mdl.set_dynamic_batch_size(m.model_id, ds, MBATCH, 2) == C.ACL_ERROR_RT_PARAM_INVALID
            acl.get_recent_err_msg()
            assert acl.mdl.execute(m.model_id, ds, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
            said = acl.get_recent_err_msg()
            assert f"input {C.ACL_DYNAMIC_TENSOR_NAME!r}" in said and "malloc_host memory, not device memory" in said
        assert acl.mdl.set_dynamic_batch_size(m.model_id, freed_ds, MBATCH, 2) == 0
        assert acl.rt.free(freed) == 0
        assert acl.mdl.execute(m.model_id, freed_ds, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID
    finally:
        acl.get_recent_err_msg()
        for buf in gear_bufs:
            acl.destroy_data_buffer(buf)
        acl.mdl.destroy_dataset(ds)
        acl.mdl.destroy_dataset(freed_ds)
        acl.rt.free_host(host)


def test_execute_matches_onnxruntime_and_reports_current_dims(acl, loaded_mlp, mlp_om):
    m = loaded_mlp
    for batch in (1, 2, 4):
        x = np.random.default_rng(batch).standard_normal((batch, IN_FEATURES)).astype(np.float32)
        m.write_input(0, x)
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, batch) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
        assert acl.mdl.get_cur_output_dims(m.desc, 0) == ({"name": "y", "dimCount": 2, "dims": [batch, 3]}, 0)
        y, idx = _reference(mlp_om[1], x)
        np.testing.assert_allclose(m.read_output(0, np.float32, (batch, OUT_FEATURES)), y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(m.read_output(1, np.int64, (batch,)), idx)


def test_current_output_dims_follow_set_dynamic_batch_size(acl, loaded_mlp):
    """get_cur_output_dims reads the gear the model was last set to (GE keeps it per model:
    SetDynamicBatchSize -> DavinciModel::SetDynamicSize, read back by GetCurrentShape), not the
    gear it last ran; before any set it answers get_output_dims (hicann/ge
    api/acl/acl_model/model/model.cpp, aclmdlGetCurOutputDims: "static or not set dynamic shape
    info" -> GetDims of the output)."""
    m = loaded_mlp
    assert acl.mdl.get_cur_output_dims(m.desc, 0) == acl.mdl.get_output_dims(m.desc, 0)
    assert acl.mdl.get_cur_output_dims(m.desc, 0)[0]["dims"] == [4, 3]  # the largest gear until one is set
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 2) == 0
    assert acl.mdl.get_cur_output_dims(m.desc, 0) == ({"name": "y", "dimCount": 2, "dims": [2, 3]}, 0)
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0  # set, not yet run
    assert acl.mdl.get_cur_output_dims(m.desc, 0) == ({"name": "y", "dimCount": 2, "dims": [4, 3]}, 0)


def test_current_output_dims_are_refused_once_the_model_is_unloaded(acl, ctx, mlp_om):
    """aclmdlGetCurOutputDims asks GE for the loaded model's current shape (GetCurShape): after
    unload that is an unknown model id (145003), after ACL's own index check (100000); the
    descriptor's other calls still answer from what it holds."""
    m = LoadedModel(acl, mlp_om[0])
    unloaded = False
    try:
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 2) == 0
        assert acl.mdl.get_cur_output_dims(m.desc, 0)[0]["dims"] == [2, OUT_FEATURES]
        assert acl.mdl.unload(m.model_id) == 0
        unloaded = True
        assert acl.mdl.get_cur_output_dims(m.desc, 0) == ({}, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)
        assert acl.mdl.get_cur_output_dims(m.desc, 1) == ({}, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)
        assert acl.mdl.get_cur_output_dims(m.desc, 2) == ({}, C.ACL_ERROR_INVALID_PARAM)
        assert acl.mdl.get_output_dims(m.desc, 0) == ({"name": "y", "dimCount": 2, "dims": [4, OUT_FEATURES]}, 0)
    finally:
        m.close(unload=not unloaded)


def test_model_id_is_not_reentrant(acl, loaded_mlp, caplog):
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 2) == 0
    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    gate = threading.Event()
    fault = faults.inject("execute", nth=1, hold=gate)  # the first execution holds the model
    try:
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, a) == 0
        fault.entered.wait()
        with caplog.at_level(logging.INFO, logger="aclserve.acl.cpu"):  # (info: the caller's LoadError says it)
            assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
            assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, b) == 0
            assert acl.rt.synchronize_stream(b) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert "re-entrant" in caplog.text
        gate.set()
        assert acl.rt.synchronize_stream(a) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
    finally:
        gate.set()
        faults.clear()
        acl.rt.destroy_stream(a)
        acl.rt.destroy_stream(b)


def test_fault_injection(acl, loaded_mlp, monkeypatch):
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
    stream, _ = acl.rt.create_stream()
    try:
        faults.inject("execute", nth=2, code=C.ACL_ERROR_GE_PARAM_INVALID)
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
        faults.inject("execute", model_id=m.model_id)
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_RT_MODEL_EXECUTE
        faults.clear()
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
    finally:
        faults.clear()
        acl.rt.destroy_stream(stream)
    assert faults.parse("execute:nth=3,code=507011; execute:delay_ms=5") == [
        {"kind": "execute", "nth": 3, "code": 507011}, {"kind": "execute", "delay_ms": 5.0}]
    with pytest.raises(ValueError):
        faults.parse("execute:bogus=1")
