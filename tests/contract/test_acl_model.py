"""Models: loading and refusals, descriptors, datasets, dynamic batch, execute rules, faults."""
from __future__ import annotations

import logging
import os
import resource
import struct
import subprocess
import sys
import threading
from pathlib import Path

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


def test_load_refusals(acl, ctx, tmp_path, mlp_om, caplog):
    assert acl.mdl.load_from_file(str(tmp_path / "missing.om")) == (0, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    assert acl.mdl.query_size(str(tmp_path / "missing.om"))[2] == C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    garbage = tmp_path / "garbage.om"
    garbage.write_bytes(b"\x00garbage" * 100)
    assert acl.mdl.load_from_file(str(garbage)) == (0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
    truncated = tmp_path / "truncated.om"
    truncated.write_bytes(Path(mlp_om[0]).read_bytes()[:-10])
    assert acl.mdl.load_from_file(str(truncated)) == (0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
    from aclserve.om import container
    good = container.read(mlp_om[0])  # a header listing no outputs: loaded, then every run failed
    header = {k: v for k, v in good.header.items() if k != "payload_sha256"}
    no_outputs = tmp_path / "no_outputs.om"
    no_outputs.write_bytes(container.encode(dict(header, outputs=[]), good.payload))
    assert acl.mdl.load_from_file(str(no_outputs)) == (0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)

    atc = bytearray(256)  # an ATC "IMOD" header (reference section 8) with a consistent length
    struct.pack_into("<4sII", atc, 0, b"IMOD", 256, 0x20000000)
    struct.pack_into("<I", atc, 76, 128)
    atc[84:84 + 9] = b"resnet50\x00"
    atc_path = tmp_path / "resnet50.om"
    atc_path.write_bytes(bytes(atc) + bytes(128))
    with caplog.at_level(logging.INFO, logger="aclserve.acl.cpu"):  # (info: the caller's LoadError says it)
        assert acl.mdl.load_from_file(str(atc_path)) == (0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "ATC" in message and "CANN" in message and "resnet50" in message and "Ascend" in message


def test_a_model_path_that_does_not_resolve_is_refused(acl, ctx, tmp_path):
    """GE resolves a model path first (RealPath): /proc/self/fd/N of a file no folder holds any
    more does not resolve, though open() follows it (the CPU runtime followed it). Whatever the
    file holds: the path is refused before it is read."""
    path = tmp_path / "gone.om"
    path.write_bytes(b"\x00garbage" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.unlink(path)
        assert acl.mdl.query_size(f"/proc/self/fd/{fd}")[2] == C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
        assert acl.mdl.load_from_file(f"/proc/self/fd/{fd}") == (0, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    finally:
        os.close(fd)


def test_a_load_with_no_descriptor_left_says_it_cannot_read_the_file(acl, ctx, tmp_path):
    """A model file its load cannot open for want of a descriptor (EMFILE) is answered 145002, model
    file missing or unreadable, as GE answers a file it cannot open or read, never a code of a bad
    file: the server then looks at the file itself and retries while the host is short
    (runtime/unread_file.py), where a bad file's code refused the model for good (a tester, t87).
    Whatever the file holds (garbage here, on either runtime): it is not read."""
    path = tmp_path / "any.om"
    path.write_bytes(b"\x00garbage" * 100)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))  # no new descriptor for anyone in this process
    try:
        sized = acl.mdl.query_size(str(path))[2]
        loaded = acl.mdl.load_from_file(str(path))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sized == C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    assert loaded == (0, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)


def test_query_size_and_load_with_caller_memory(acl, ctx, mlp_om, acl_kind):
    path = mlp_om[0]
    work, weight, ret = acl.mdl.query_size(path)
    assert ret == 0 and work > 0 and weight > 0
    work_ptr, _ = acl.rt.malloc(work, C.ACL_MEM_MALLOC_HUGE_FIRST)
    weight_ptr, _ = acl.rt.malloc(weight, C.ACL_MEM_MALLOC_HUGE_FIRST)
    try:
        assert acl.mdl.load_from_file_with_mem(path, work_ptr, work, weight_ptr, weight - 1)[1] \
            == C.ACL_ERROR_GE_PARAM_INVALID
        free_before = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0]
        model_id, ret = acl.mdl.load_from_file_with_mem(path, work_ptr, work, weight_ptr, weight)
        assert ret == 0
        assert acl.rt.get_mem_info(C.ACL_HBM_MEM)[0] == free_before  # used the caller's memory
        with open(path, "rb") as f:  # the ONNX payload really sits in the weight memory
            assert f.read()[-weight:] == acl.util.ptr_to_bytes(weight_ptr, weight)
        assert acl.mdl.unload(model_id) == 0
        assert acl.mdl.unload(model_id) == C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    finally:
        acl.rt.free(work_ptr)
        acl.rt.free(weight_ptr)


def test_load_from_file_and_mem_allocate_device_memory_until_unload(acl, ctx, mlp_om):
    free0 = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0]
    model_id, ret = acl.mdl.load_from_file(mlp_om[0])
    assert ret == 0 and acl.rt.get_mem_info(C.ACL_HBM_MEM)[0] < free0
    assert acl.mdl.unload(model_id) == 0
    data = Path(mlp_om[0]).read_bytes()
    model_id, ret = acl.mdl.load_from_mem(acl.util.bytes_to_ptr(data), len(data))
    assert ret == 0
    assert acl.mdl.unload(model_id) == 0
    assert acl.rt.get_mem_info(C.ACL_HBM_MEM)[0] == free0


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
