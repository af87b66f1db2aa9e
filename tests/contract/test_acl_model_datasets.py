"""A model's descriptor, datasets and data buffers (which own nothing they hold),
set_dynamic_batch_size's rules, and an execution's datasets: the gear set on its input dataset,
one buffer per input and output."""
from __future__ import annotations

import numpy as np
from .conftest import IN_FEATURES, MBATCH, OUT_FEATURES, LoadedModel

from aclserve.acl import constants as C


def test_descriptor(acl, loaded_mlp):
    desc = loaded_mlp.desc
    assert acl.mdl.get_num_inputs(desc) == 2 and acl.mdl.get_num_outputs(desc) == 2
    assert acl.mdl.get_input_name_by_index(desc, 0) == "x"
    assert acl.mdl.get_input_name_by_index(desc, MBATCH) == C.ACL_DYNAMIC_TENSOR_NAME
    assert acl.mdl.get_input_index_by_name(desc, C.ACL_DYNAMIC_TENSOR_NAME) == (MBATCH, 0)
    assert acl.mdl.get_input_index_by_name(desc, "nope")[1] != 0
    assert acl.mdl.get_output_index_by_name(desc, "idx") == (1, 0)
    assert acl.mdl.get_input_dims(desc, 0) == ({"name": "x", "dimCount": 2, "dims": [-1, IN_FEATURES]}, 0)
    assert acl.mdl.get_input_dims(desc, MBATCH)[0]["dims"] == [1]
    # an input's batch is -1, an output is at the largest gear (CANN's aclmdlGetInputDims and
    # aclmdlGetOutputDims pages): the CPU runtime must not show the server a -1 the device never sends
    assert acl.mdl.get_output_dims(desc, 1) == ({"name": "idx", "dimCount": 1, "dims": [4]}, 0)
    assert acl.mdl.get_output_dims(desc, 0)[0]["dims"] == [4, OUT_FEATURES]
    assert acl.mdl.get_input_dims(desc, 5) == ({}, C.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.get_input_size_by_index(desc, 0) == 4 * IN_FEATURES * 4  # largest gear (4)
    assert acl.mdl.get_input_size_by_index(desc, MBATCH) == 8
    assert acl.mdl.get_output_size_by_index(desc, 0) == 4 * OUT_FEATURES * 4
    assert acl.mdl.get_output_size_by_index(desc, 1) == 4 * 8
    assert acl.mdl.get_input_data_type(desc, 0) == C.ACL_FLOAT
    assert acl.mdl.get_input_data_type(desc, MBATCH) == C.ACL_INT64
    assert acl.mdl.get_output_data_type(desc, 1) == C.ACL_INT64
    assert acl.mdl.get_input_format(desc, 0) == C.ACL_FORMAT_ND
    assert acl.mdl.get_output_name_by_index(desc, 9) == ""
    assert acl.mdl.get_dynamic_batch(desc) == ({"batchCount": 3, "batch": [1, 2, 4]}, 0)
    # an input without static AIPP (the model's own, the gear input): pyACL's (None, 145015), or
    # the deprecated 100038 of an older CANN
    for index in (0, MBATCH):
        assert acl.mdl.get_first_aipp_info(loaded_mlp.model_id, index) in (
            (None, C.ACL_ERROR_GE_AIPP_NOT_EXIST), (None, C.ACL_ERROR_NOT_STATIC_AIPP))


def test_datasets_and_buffers_do_not_own_what_they_hold(acl, ctx, device_buffer):
    ptr = device_buffer(64)
    buf = acl.create_data_buffer(ptr, 64)
    assert buf != 0 and acl.get_data_buffer_addr(buf) == ptr and acl.get_data_buffer_size_v2(buf) == 64
    ds = acl.mdl.create_dataset()
    assert acl.mdl.add_dataset_buffer(ds, buf) == (ds, 0)
    assert acl.mdl.get_dataset_num_buffers(ds) == 1
    assert acl.mdl.get_dataset_buffer(ds, 0) == buf and acl.mdl.get_dataset_buffer(ds, 1) == 0
    assert acl.mdl.destroy_dataset(ds) == 0
    assert acl.get_data_buffer_addr(buf) == ptr  # the buffer survives its dataset
    assert acl.update_data_buffer(buf, ptr + 32, 32) == 0
    assert (acl.get_data_buffer_addr(buf), acl.get_data_buffer_size_v2(buf)) == (ptr + 32, 32)
    assert acl.destroy_data_buffer(buf) == 0
    assert acl.rt.memset(ptr, 64, 0, 64) == 0  # and the memory survives its buffer


def test_set_dynamic_batch_size_rules(acl, loaded_mlp, static_om):
    m = loaded_mlp
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 0) == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, 7, 2) == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 3) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0
    # ACL's argument checks come before GE looks the model up (hicann/ge model.cpp, then ge_executor.cc)
    assert acl.mdl.set_dynamic_batch_size(999_999, m.inputs, 7, 2) == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.set_dynamic_batch_size(999_999, m.inputs, MBATCH, 2) == C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    host, _ = acl.rt.malloc_host(8)
    try:  # written at once into the dataset's buffer, no stream involved
        assert acl.rt.memcpy(host, 8, m.buffer_ptr(m.inputs, MBATCH), 8, C.ACL_MEMCPY_DEVICE_TO_HOST) == 0
        value = np.frombuffer(acl.util.ptr_to_bytes(host, 8), np.int64)[0]
    finally:
        acl.rt.free_host(host)
    assert value == 4
    static = LoadedModel(acl, static_om[0])
    try:
        assert acl.mdl.get_dynamic_batch(static.desc) == ({"batchCount": 0, "batch": []}, 0)
        # GE finds no gear to match in a static model (IsDynamicBatchSizeMatchModel on empty batch
        # info): 145013, not 100019 (hicann/ge runtime/v1/executor/ge_executor.cc, SetDynamicBatchSize)
        assert acl.mdl.set_dynamic_batch_size(static.model_id, static.inputs, 0, 2) \
            == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    finally:
        static.close()


def test_set_dynamic_batch_size_on_a_buffer_without_address_is_invalid_param(acl, loaded_mlp):
    """aclmdlSetDynamicBatchSize refuses a data buffer whose address is null with 100000 itself,
    before GE sees it (hicann/ge api/acl/acl_model/model/model.cpp: "data buffer addr cannot be
    null" -> ACL_ERROR_INVALID_PARAM); GE's own 145011 is never reached through this API."""
    m = loaded_mlp
    ds = acl.mdl.create_dataset()
    null_buf = acl.create_data_buffer(0, 8)
    try:
        acl.mdl.add_dataset_buffer(ds, acl.mdl.get_dataset_buffer(m.inputs, 0))
        acl.mdl.add_dataset_buffer(ds, null_buf)
        assert acl.mdl.set_dynamic_batch_size(m.model_id, ds, MBATCH, 2) == C.ACL_ERROR_INVALID_PARAM
    finally:
        acl.destroy_data_buffer(null_buf)
        acl.mdl.destroy_dataset(ds)


def _dataset_of(acl, buffers):
    ds = acl.mdl.create_dataset()
    for buf in buffers:
        assert acl.mdl.add_dataset_buffer(ds, buf) == (ds, 0)
    return ds


def test_an_execution_runs_at_the_gear_set_on_its_input_dataset(acl, loaded_mlp, device_buffer):
    """The device runs a dynamic-batch model at the gear aclmdlSetDynamicBatchSize recorded on
    the input dataset (dataset->dynamicBatchSize, which ModelExecute hands to GE: hicann/ge
    model.cpp), not at the bytes of its gear buffer. A dataset it was never set on is refused
    with 145013 (what the device does with one is unverified) whatever its buffer holds: the
    buffer of a dataset that was set, or a gear copied in. A batch GE refused stays recorded
    (ACL records it first), and a buffer written after the set no longer matches its dataset:
    both are refused too."""
    m = loaded_mlp
    m.write_input(0, np.zeros((4, IN_FEATURES), np.float32))
    mbatch_size = acl.mdl.get_input_size_by_index(m.desc, MBATCH)
    own_mbatch = device_buffer(mbatch_size)
    x_buffer = acl.mdl.get_dataset_buffer(m.inputs, 0)
    copied_buffer = acl.create_data_buffer(own_mbatch, mbatch_size)
    shared = _dataset_of(acl, [x_buffer, acl.mdl.get_dataset_buffer(m.inputs, MBATCH)])
    copied = _dataset_of(acl, [x_buffer, copied_buffer])
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 2) == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
        assert acl.mdl.execute(m.model_id, shared, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.execute_async(m.model_id, shared, m.outputs, stream) \
            == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID  # at the call, as the dataset is read there
        assert acl.rt.memcpy(own_mbatch, mbatch_size, m.buffer_ptr(m.inputs, MBATCH), mbatch_size,
                             C.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0
        assert acl.mdl.execute(m.model_id, copied, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.set_dynamic_batch_size(m.model_id, copied, MBATCH, 2) == 0
        assert acl.mdl.execute(m.model_id, copied, m.outputs) == 0
        # 3 is no gear: GE refuses it, the dataset keeps it, its buffer keeps 2
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 3) \
            == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0
        assert acl.rt.memcpy(m.buffer_ptr(m.inputs, MBATCH), mbatch_size, own_mbatch, mbatch_size,
                             C.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0  # 2 written over the 4 it was set to
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 4) == 0
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        acl.rt.destroy_stream(stream)
        acl.mdl.destroy_dataset(shared)
        acl.mdl.destroy_dataset(copied)
        acl.destroy_data_buffer(copied_buffer)


def test_an_execution_takes_one_buffer_per_input_and_output(acl, loaded_mlp, device_buffer):
    """The OM2 executor refuses a dataset with more or fewer buffers than the model has inputs
    (outputs) with 100000 (hicann/ge model_om2.cpp, Om2GetModelTensorDesc); what the classic
    executor does with extra ones is unverified: refused here too, at the call."""
    m = loaded_mlp
    extra = acl.create_data_buffer(device_buffer(64), 64)
    inputs = [acl.mdl.get_dataset_buffer(m.inputs, i) for i in range(2)]
    outputs = [acl.mdl.get_dataset_buffer(m.outputs, i) for i in range(2)]
    more_in, more_out = _dataset_of(acl, inputs + [extra]), _dataset_of(acl, outputs + [extra])
    fewer_out = _dataset_of(acl, outputs[:1])
    stream, _ = acl.rt.create_stream()
    try:
        assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, MBATCH, 1) == 0
        assert acl.mdl.set_dynamic_batch_size(m.model_id, more_in, MBATCH, 1) == 0
        for ins, outs in ((more_in, m.outputs), (m.inputs, more_out), (m.inputs, fewer_out)):
            assert acl.mdl.execute(m.model_id, ins, outs) == C.ACL_ERROR_INVALID_PARAM
            assert acl.mdl.execute_async(m.model_id, ins, outs, stream) == C.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0
    finally:
        acl.rt.destroy_stream(stream)
        for ds in (more_in, more_out, fewer_out):
            acl.mdl.destroy_dataset(ds)
        acl.destroy_data_buffer(extra)
