"""What an execution takes at its call: the datasets' buffers, as ModelExecute copies each one's
address and size into GE's blobs (hicann/ge model.cpp), and the gear."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults

from .conftest import IN_FEATURES, MBATCH, OUT_FEATURES

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
