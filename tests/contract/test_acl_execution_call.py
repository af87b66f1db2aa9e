"""What an execution takes at its call: the datasets' buffers, as ModelExecute copies each one's
address and size into GE's blobs (hicann/ge model.cpp), and the gear; and the buffers and model
memory it refuses."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults

from .conftest import IN_FEATURES, MBATCH, OUT_FEATURES, LoadedModel, write_cpu_om

D2D = C.ACL_MEMCPY_DEVICE_TO_DEVICE


def test_a_queued_execution_runs_on_the_buffers_its_datasets_held_at_the_call(acl, loaded_mlp, mlp_om,
                                                                                device_buffer, cpu_only):
    """An application re-pointing its data buffers (update_data_buffer) once execute_async has
    returned, one dataset double-buffered, does not change the execution queued: it reads and
    writes the memory the buffers named at the call. The CPU runtime read them when the stream
    ran it: the output went to the new buffer. (CPU only: the stream is held by a fault.)"""
    m = loaded_mlp
    x = np.random.default_rng(3).standard_normal((4, IN_FEATURES)).astype(np.float32)
    m.write_input(0, x)
    x_size, y_size = (acl.mdl.get_input_size_by_index(m.desc, 0), acl.mdl.get_output_size_by_index(m.desc, 0))
    other_x, other_y = device_buffer(x_size), device_buffer(y_size)
    assert acl.rt.memset(other_x, x_size, 0, x_size) == 0
    assert acl.rt.memset(other_y, y_size, 0, y_size) == 0
    x_buffer, y_buffer = acl.mdl.get_dataset_buffer(m.inputs, 0), acl.mdl.get_dataset_buffer(m.outputs, 0)
    x_ptr, y_ptr = m.buffer_ptr(m.inputs, 0), m.buffer_ptr(m.outputs, 0)
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0
    stream, _ = acl.rt.create_stream()
    gate = threading.Event()
    held = faults.inject("memcpy", nth=1, hold=gate)
    try:
        assert acl.rt.memcpy_async(other_x, x_size, other_x, 64, D2D, stream) == 0  # held on the stream
        assert held.entered.wait(30)
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert acl.update_data_buffer(x_buffer, other_x, x_size) == 0
        assert acl.update_data_buffer(y_buffer, other_y, y_size) == 0
        gate.set()
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        gate.set()
        acl.rt.destroy_stream(stream)
        acl.update_data_buffer(x_buffer, x_ptr, x_size)
        acl.update_data_buffer(y_buffer, y_ptr, y_size)
    y = ort.InferenceSession(mlp_om[1].SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.read_output(0, np.float32, (4, OUT_FEATURES)), y, rtol=1e-5, atol=1e-6)
    assert acl.util.ptr_to_bytes(other_y, y_size) == bytes(y_size)  # the buffer named after the call: untouched


def test_model_buffers_cut_from_one_block_start_64_byte_aligned(acl, loaded_mlp, device_buffer, cpu_only):
    """CANN asks each piece an application cuts from one malloc block to start at a 64-byte-aligned
    offset (malloc's own alignment): an input or output elsewhere is refused at the call with
    107000, as memcpy_async refuses such an address. The CPU runtime executed buffers at +1,
    +600 and +1203 of a block. (CPU only: what a device does with one is unverified.)"""
    m = loaded_mlp
    sizes = [acl.mdl.get_input_size_by_index(m.desc, i) for i in range(2)]
    sizes += [acl.mdl.get_output_size_by_index(m.desc, i) for i in range(2)]
    block = device_buffer(4096)
    stream, _ = acl.rt.create_stream()
    buffers_made, datasets_made = [], []

    def execute_at(offsets):
        buffers = [acl.create_data_buffer(block + offset, size) for offset, size in zip(offsets, sizes)]
        ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
        buffers_made.extend(buffers)
        datasets_made.extend([ins, outs])
        for ds, part in ((ins, buffers[:2]), (outs, buffers[2:])):
            for buf in part:
                assert acl.mdl.add_dataset_buffer(ds, buf)[1] == 0
        assert acl.mdl.set_dynamic_batch_size(m.model_id, ins, MBATCH, 4) == 0
        return acl.mdl.execute(m.model_id, ins, outs), acl.mdl.execute_async(m.model_id, ins, outs, stream)

    try:
        assert execute_at([0, 576, 1152, 1280]) == (0, 0)  # each piece at a 64-byte-aligned offset
        assert acl.rt.synchronize_stream(stream) == 0
        for offsets in ([1, 600, 1203, 1792], [0, 576, 1160, 1280], [32, 576, 1152, 1280]):
            assert execute_at(offsets) == (C.ACL_ERROR_RT_PARAM_INVALID,) * 2, offsets
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        acl.rt.destroy_stream(stream)
        for buf in buffers_made:
            acl.destroy_data_buffer(buf)
        for ds in datasets_made:
            acl.mdl.destroy_dataset(ds)


def test_a_dataset_holding_a_destroyed_buffer_is_refused(acl, loaded_mlp, cpu_only):
    """destroy_data_buffer of a buffer a dataset still holds: on a device the dataset keeps the
    freed aclDataBuffer* and ModelExecute reads it (undefined behaviour). The CPU runtime refuses
    that dataset where it would be used, with 100000 as for any other destroyed handle: execute,
    execute_async, set_dynamic_batch_size on it, and get_dataset_buffer gives 0 for it. It ran
    them as if the buffer were alive. (CPU only: the device's answer is undefined.)"""
    m = loaded_mlp
    sizes = [acl.mdl.get_input_size_by_index(m.desc, i) for i in range(2)]
    sizes += [acl.mdl.get_output_size_by_index(m.desc, i) for i in range(2)]
    ptrs = [m.buffer_ptr(m.inputs, i) for i in range(2)] + [m.buffer_ptr(m.outputs, i) for i in range(2)]
    buffers = [acl.create_data_buffer(ptr, size) for ptr, size in zip(ptrs, sizes)]
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    for ds, part in ((ins, buffers[:2]), (outs, buffers[2:])):
        for buf in part:
            assert acl.mdl.add_dataset_buffer(ds, buf)[1] == 0
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.mdl.set_dynamic_batch_size(m.model_id, ins, MBATCH, 4) == 0
        assert acl.mdl.execute(m.model_id, ins, outs) == 0
        assert acl.destroy_data_buffer(buffers[3]) == 0  # the output `idx`
        acl.get_recent_err_msg()
        assert acl.mdl.execute(m.model_id, ins, outs) == C.ACL_ERROR_INVALID_PARAM
        assert "buffer 1 of the output dataset was destroyed" in acl.get_recent_err_msg()
        assert acl.mdl.execute_async(m.model_id, ins, outs, stream) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.get_dataset_buffer(outs, 1) == 0 and acl.mdl.get_dataset_buffer(outs, 0) == buffers[2]
        assert acl.mdl.execute(m.model_id, ins, m.outputs) == 0  # the input dataset is whole
        assert acl.destroy_data_buffer(buffers[MBATCH]) == 0
        assert acl.mdl.set_dynamic_batch_size(m.model_id, ins, MBATCH, 2) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.execute(m.model_id, ins, m.outputs) == C.ACL_ERROR_INVALID_PARAM
        assert acl.get_recent_err_msg().count(f"buffer {MBATCH} of the input dataset was destroyed") == 2
        assert acl.mdl.execute_async(m.model_id, ins, m.outputs, stream) == C.ACL_ERROR_INVALID_PARAM
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.destroy_data_buffer(buffers[3]) == C.ACL_ERROR_INVALID_PARAM  # destroyed once
    finally:
        acl.get_recent_err_msg()  # (what the refusals said: not another test's)
        acl.rt.destroy_stream(stream)
        for buf in (buffers[0], buffers[2]):
            acl.destroy_data_buffer(buf)
        acl.mdl.destroy_dataset(ins)
        acl.mdl.destroy_dataset(outs)


@pytest.fixture
def doubling(acl, ctx, tmp_path, cpu_only):
    """y = 2x, FP32 [N, 32] at gears 1,2,4: an output of 512 bytes at gear 4, more than the 64
    bytes GE lets a buffer fall short by (the MLP's outputs, 48 and 32 bytes, are within them)."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "doubling",
                              [vi("x", TensorProto.FLOAT, ["n", IN_FEATURES])],
                              [vi("y", TensorProto.FLOAT, ["n", IN_FEATURES])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    loaded = LoadedModel(acl, write_cpu_om(tmp_path / "doubling.om", model, [1, 2, 4]))
    yield loaded
    loaded.close()


def test_an_output_buffer_short_of_the_output_is_refused(acl, doubling):
    """As a short input (test_execute_rules): an output buffer more than 64 bytes smaller than the
    output's size is refused at the call with 145000, execute and execute_async alike; 64 bytes
    short is accepted, and the model writes what fits."""
    m = doubling
    y_size = acl.mdl.get_output_size_by_index(m.desc, 0)
    y_buffer, y_ptr = acl.mdl.get_dataset_buffer(m.outputs, 0), m.buffer_ptr(m.outputs, 0)
    x = np.arange(4 * IN_FEATURES, dtype=np.float32).reshape(4, IN_FEATURES)
    m.write_input(0, x)
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.update_data_buffer(y_buffer, y_ptr, y_size - 65) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == C.ACL_ERROR_GE_PARAM_INVALID
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.update_data_buffer(y_buffer, y_ptr, y_size - 64) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
    finally:
        acl.rt.destroy_stream(stream)
        acl.update_data_buffer(y_buffer, y_ptr, y_size)
    np.testing.assert_array_equal(m.read_output(0, np.float32, (4, IN_FEATURES)).ravel()[:-16], 2 * x.ravel()[:-16])


def test_a_model_whose_work_memory_was_freed_while_loaded_is_refused(acl, loaded_mlp, mlp_om):
    """pyACL: memory given to load_from_file_with_mem is kept until after unload. Its work memory
    freed before, each execution of the model fails with 507011 (execute at once, execute_async
    at the synchronize), where a device would run on freed memory; the unload succeeds.
    (CPU only: a device's answer is undefined; tests/runtime/test_cpu_memory_in_use.py checks the
    memory stays mapped until the unload.)"""
    m = loaded_mlp  # (its datasets fit the same OM loaded again on the caller's memory)
    work, weight, ret = acl.mdl.query_size(mlp_om[0])
    assert ret == 0
    work_ptr, _ = acl.rt.malloc(work, C.ACL_MEM_MALLOC_NORMAL_ONLY)
    weight_ptr, _ = acl.rt.malloc(weight, C.ACL_MEM_MALLOC_NORMAL_ONLY)
    model_id, ret = acl.mdl.load_from_file_with_mem(mlp_om[0], work_ptr, work, weight_ptr, weight)
    assert ret == 0
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.mdl.set_dynamic_batch_size(model_id, m.inputs, MBATCH, 2) == 0
        assert acl.mdl.execute(model_id, m.inputs, m.outputs) == 0
        assert acl.rt.free(work_ptr) == 0
        assert acl.mdl.execute(model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.mdl.execute_async(model_id, m.inputs, m.outputs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == C.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0  # (the model on its own memory runs on)
    finally:
        acl.rt.destroy_stream(stream)
        assert acl.mdl.unload(model_id) == 0
        acl.rt.free(weight_ptr)
