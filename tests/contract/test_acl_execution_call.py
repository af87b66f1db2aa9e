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
