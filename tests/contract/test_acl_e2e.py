"""End to end in the style of the public pyACL samples (acl_resnet50 / sample_process):
init, device, context, stream, load with caller memory, descriptor, HUGE_FIRST device buffers,
malloc_host staging, copy in, execute and execute_async for every gear, copy out, compare with
ONNX Runtime on the source graph, tear down in reverse order; device memory back to its start."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from aclserve.acl import constants as C
from aclserve.dtypes import acl_to_numpy

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
DEVICE_ID = 0


def check(ret, what):
    assert ret == 0, f"{what} failed with {ret}"


def test_sample_style_end_to_end(acl, mlp_om):
    model_path, source = mlp_om
    reference = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])

    check(acl.rt.set_device(DEVICE_ID), "set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "create_context")
    start_free, total, ret = acl.rt.get_mem_info(C.ACL_HBM_MEM)
    check(ret, "get_mem_info")
    stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")

    work_size, weight_size, ret = acl.mdl.query_size(model_path)
    check(ret, "query_size")
    work_ptr, ret = acl.rt.malloc(work_size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc work")
    weight_ptr, ret = acl.rt.malloc(weight_size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc weight")
    model_id, ret = acl.mdl.load_from_file_with_mem(model_path, work_ptr, work_size, weight_ptr, weight_size)
    check(ret, "load_from_file_with_mem")
    desc = acl.mdl.create_desc()
    check(acl.mdl.get_desc(desc, model_id), "get_desc")

    blocks = []  # malloc_host's blocks, freed at the end

    def make_dataset(count, size_of):
        dataset, device, host = acl.mdl.create_dataset(), [], []
        for i in range(count):
            size = size_of(desc, i)
            dev_ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "malloc buffer")
            host_ptr, ret = acl.rt.malloc_host(size + 63)  # used from its first 64-byte aligned byte:
            check(ret, "malloc_host")                     # on a board it need not start on one
            buf = acl.create_data_buffer(dev_ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(dataset, buf)
            check(ret, "add_dataset_buffer")
            device.append((dev_ptr, size, buf))
            host.append((host_ptr + 63) & ~63)
            blocks.append(host_ptr)
        return dataset, device, host

    in_ds, in_dev, in_host = make_dataset(acl.mdl.get_num_inputs(desc), acl.mdl.get_input_size_by_index)
    out_ds, out_dev, out_host = make_dataset(acl.mdl.get_num_outputs(desc), acl.mdl.get_output_size_by_index)
    mbatch_index, ret = acl.mdl.get_input_index_by_name(desc, C.ACL_DYNAMIC_TENSOR_NAME)
    check(ret, "get_input_index_by_name")
    gears, ret = acl.mdl.get_dynamic_batch(desc)
    check(ret, "get_dynamic_batch")
    x_dims, _ = acl.mdl.get_input_dims(desc, 0)
    features = x_dims["dims"][1]
    out_types = [acl.mdl.get_output_data_type(desc, i) for i in range(len(out_dev))]

    assert gears["batch"] == [1, 2, 4]  # the fixture's gears: every one is run and compared below
    for batch in gears["batch"]:
        for mode in ("execute", "execute_async"):
            x = np.random.default_rng(batch * 10 + len(mode)).standard_normal((batch, features)).astype(np.float32)
            data = x.tobytes()
            acl.util.ptr_to_numpy(in_host[0], (len(data),), np.dtype(np.uint8).num)[:] = np.frombuffer(data, np.uint8)
            dev_ptr, size, _ = in_dev[0]
            check(acl.mdl.set_dynamic_batch_size(model_id, in_ds, mbatch_index, batch), "set_dynamic_batch_size")
            if mode == "execute":
                check(acl.rt.memcpy(dev_ptr, size, in_host[0], len(data), ACL_MEMCPY_HOST_TO_DEVICE), "memcpy")
                check(acl.mdl.execute(model_id, in_ds, out_ds), "execute")
            else:
                check(acl.rt.memcpy_async(dev_ptr, size, in_host[0], len(data), ACL_MEMCPY_HOST_TO_DEVICE, stream),
                      "memcpy_async")
                check(acl.mdl.execute_async(model_id, in_ds, out_ds, stream), "execute_async")
            outputs = []
            for i, (out_ptr, out_size, _) in enumerate(out_dev):
                dims, ret = acl.mdl.get_cur_output_dims(desc, i) if mode == "execute" else (None, 0)
                check(ret, "get_cur_output_dims")
                dtype = acl_to_numpy(out_types[i])
                shape = (batch, *((dims or acl.mdl.get_output_dims(desc, i)[0])["dims"][1:]))
                nbytes = int(np.prod(shape)) * dtype.itemsize
                if mode == "execute":
                    check(acl.rt.memcpy(out_host[i], out_size, out_ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST), "memcpy")
                else:
                    check(acl.rt.memcpy_async(out_host[i], out_size, out_ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST,
                                              stream), "memcpy_async")
                outputs.append((i, dtype, shape, nbytes))
            if mode == "execute_async":
                check(acl.rt.synchronize_stream(stream), "synchronize_stream")
            expected = reference.run(None, {"x": x})
            for i, dtype, shape, nbytes in outputs:
                got = np.frombuffer(acl.util.ptr_to_bytes(out_host[i], nbytes), dtype).reshape(shape)
                np.testing.assert_allclose(got, expected[i], rtol=1e-5, atol=1e-6, err_msg=f"{mode} batch {batch}")

    for dataset, device in ((in_ds, in_dev), (out_ds, out_dev)):
        for dev_ptr, _, buf in device:
            check(acl.destroy_data_buffer(buf), "destroy_data_buffer")
            check(acl.rt.free(dev_ptr), "free")
        check(acl.mdl.destroy_dataset(dataset), "destroy_dataset")
    for block in blocks:
        check(acl.rt.free_host(block), "free_host")
    check(acl.mdl.destroy_desc(desc), "destroy_desc")
    check(acl.mdl.unload(model_id), "unload")
    check(acl.rt.free(work_ptr), "free work")
    check(acl.rt.free(weight_ptr), "free weight")
    check(acl.rt.destroy_stream(stream), "destroy_stream")
    end_free, end_total, ret = acl.rt.get_mem_info(C.ACL_HBM_MEM)
    check(ret, "get_mem_info")
    assert (end_free, end_total) == (start_free, total), "device memory not returned"
    check(acl.rt.destroy_context(context), "destroy_context")
    check(acl.rt.reset_device(DEVICE_ID), "reset_device")
