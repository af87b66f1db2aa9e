"""Models loaded: the refusals of files that are no loadable model or cannot be read, query_size
and a load into the caller's memory, and the device memory a load takes until its unload."""
from __future__ import annotations

import logging
import os
import resource
import struct
from pathlib import Path

from aclserve.acl import constants as C


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
