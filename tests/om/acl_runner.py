"""Run one batch of an OM through the pyACL model API (acl.mdl load, datasets, execute), on the CPU runtime.

Deliberately written against the documented API rather than aclserve.runtime, so the compile
tests check that a CPU OM loads and runs the way an ATC OM would on an NPU.
"""
from __future__ import annotations

import contextlib

import numpy as np

from aclserve.om.names import tensor_name

from aclserve.acl import check, check_handle
from aclserve.acl import constants as C
from aclserve.dtypes import acl_to_numpy


def cpu_acl():
    """The CPU runtime module (imported here: a broken runtime fails the tests that use it)."""
    from aclserve.acl import cpu as acl
    return acl


@contextlib.contextmanager
def acl_context(acl, device: int = 0):
    ret = acl.init()
    if ret not in (C.ACL_SUCCESS, C.ACL_ERROR_REPEAT_INITIALIZE):
        check("init", ret)
    check("rt.set_device", acl.rt.set_device(device))
    ctx = check("rt.create_context", acl.rt.create_context(device))
    try:
        yield ctx
    finally:
        check("rt.destroy_context", acl.rt.destroy_context(ctx))
        check("rt.reset_device", acl.rt.reset_device(device))


def run_batch(acl, path: str, feeds: dict[str, np.ndarray], batch: int | None) -> dict[str, np.ndarray]:
    """Load `path`, run one batch (batch=None for a static model), unload; return outputs by name."""
    with contextlib.ExitStack() as stack:
        model_id = check("mdl.load_from_file", acl.mdl.load_from_file(path))
        stack.callback(lambda: check("mdl.unload", acl.mdl.unload(model_id)))
        desc = check_handle("mdl.create_desc", acl.mdl.create_desc())
        stack.callback(lambda: check("mdl.destroy_desc", acl.mdl.destroy_desc(desc)))
        check("mdl.get_desc", acl.mdl.get_desc(desc, model_id))

        def dataset(count, size_of, fill):
            ds = check_handle("mdl.create_dataset", acl.mdl.create_dataset())
            stack.callback(lambda: check("mdl.destroy_dataset", acl.mdl.destroy_dataset(ds)))
            for i in range(count):
                size = size_of(desc, i)
                dev = check("rt.malloc", acl.rt.malloc(size, C.ACL_MEM_MALLOC_HUGE_FIRST))
                stack.callback(lambda dev=dev: check("rt.free", acl.rt.free(dev)))
                fill(i, dev, size)
                buf = check_handle("create_data_buffer", acl.create_data_buffer(dev, size))
                stack.callback(lambda buf=buf: check("destroy_data_buffer", acl.destroy_data_buffer(buf)))
                check("mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(ds, buf))
            return ds

        dyn_index = None

        def fill_input(i, dev, size):
            nonlocal dyn_index
            name = acl.mdl.get_input_name_by_index(desc, i)
            if name == C.ACL_DYNAMIC_TENSOR_NAME:
                dyn_index = i
                return
            data = np.ascontiguousarray(feeds[name]).tobytes()
            assert len(data) <= size, f"input {name}: {len(data)} bytes > buffer {size}"
            check("rt.memcpy", acl.rt.memcpy(dev, size, acl.util.bytes_to_ptr(data), len(data),
                                             C.ACL_MEMCPY_HOST_TO_DEVICE))

        in_ds = dataset(acl.mdl.get_num_inputs(desc), acl.mdl.get_input_size_by_index, fill_input)
        out_ds = dataset(acl.mdl.get_num_outputs(desc), acl.mdl.get_output_size_by_index, lambda *a: None)
        if batch is not None:
            assert dyn_index is not None, "dynamic-batch model without ascend_mbatch_shape_data"
            check("mdl.set_dynamic_batch_size", acl.mdl.set_dynamic_batch_size(model_id, in_ds, dyn_index, batch))
        check("mdl.execute", acl.mdl.execute(model_id, in_ds, out_ds))

        results = {}
        for i in range(acl.mdl.get_num_outputs(desc)):
            name = acl.mdl.get_output_name_by_index(desc, i)
            dims = check("mdl.get_cur_output_dims", acl.mdl.get_cur_output_dims(desc, i))["dims"]
            dtype = acl_to_numpy(acl.mdl.get_output_data_type(desc, i))
            nbytes = int(np.prod(dims)) * dtype.itemsize
            host = check("rt.malloc_host", acl.rt.malloc_host(max(nbytes, 1)))
            stack.callback(lambda host=host: check("rt.free_host", acl.rt.free_host(host)))
            dev = acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(out_ds, i))
            check("rt.memcpy", acl.rt.memcpy(host, nbytes, dev, nbytes, C.ACL_MEMCPY_DEVICE_TO_HOST))
            raw = acl.util.ptr_to_bytes(host, nbytes)
            results[tensor_name(name)] = np.frombuffer(raw, dtype).reshape(dims).copy()
            results.setdefault("_reported_names", []).append(name)
        return results
