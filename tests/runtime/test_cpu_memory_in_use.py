"""The CPU runtime never touches memory the application freed: work queued on a stream (a copy, a
memset, a JPEGD or VPC task) finds its memory gone when it runs and fails, its stream's next
synchronize saying so, and work running as its memory is freed (the CPU runtime cannot stop it
midway, a device's task would fault at worst) keeps it mapped until it is done. Each freed
allocation is a mapping of its own (past 64 KiB), so touching it after its unmapping ends the
process: each case runs in a process of its own, a stream's task held there by an injected fault."""
from __future__ import annotations

from aclserve.acl import constants as C

from .own_process import run_script

_PRELUDE = """
import faulthandler, json, sys, threading
from aclserve.acl import cpu as acl
from aclserve.acl import constants as C
from aclserve.acl.cpu import _memory, faults

faulthandler.enable()  # a touch of unmapped memory says so
acl.init()
acl.rt.set_device(0)
ctx, _ = acl.rt.create_context(0)
stream, _ = acl.rt.create_stream()
BIG = 1 << 20  # a mapping of its own (an allocation past 64 KiB)
D2H, D2D = C.ACL_MEMCPY_DEVICE_TO_HOST, C.ACL_MEMCPY_DEVICE_TO_DEVICE


def device(size=BIG):
    ptr, ret = acl.rt.malloc(size, C.ACL_MEM_MALLOC_NORMAL_ONLY)
    assert ret == 0
    return ptr


def mapping(ptr):
    '''The mapping of the allocation at `ptr` (device or malloc_host memory): closed once unmapped.'''
    return (_memory._device_allocs.get(ptr) or _memory._host_allocs[ptr])._mm


def holding(kind, **match):
    '''The gate of the next `kind` task, held by a fault once it runs (entered) until the gate is set.'''
    gate = threading.Event()
    return gate, faults.inject(kind, nth=1, hold=gate, code=0, **match)
"""

_QUEUED_COPY_AND_MEMSET = _PRELUDE + """
spare, source, target = device(128), device(), device()
host, _ = acl.rt.malloc_host(BIG)
gate, held = holding("memcpy")
out = {"held": acl.rt.memcpy_async(spare + 64, 64, spare, 64, D2D, stream)}
assert held.entered.wait(30)
out["copy"] = acl.rt.memcpy_async(host, BIG, source, BIG, D2H, stream)
out["memset"] = acl.rt.memset_async(target, BIG, 7, BIG, stream)
out["frees"] = [acl.rt.free(source), acl.rt.free_host(host), acl.rt.free(target)]
gate.set()
out["sync"] = acl.rt.synchronize_stream(stream)
out["next"] = [acl.rt.memcpy_async(spare + 64, 64, spare, 64, D2D, stream), acl.rt.synchronize_stream(stream)]
print(json.dumps(out))
"""


def test_a_copy_or_memset_queued_on_a_stream_finds_its_freed_memory_gone_when_it_runs():
    """Both were checked at the call and ran later with no second look: the process ended with
    a segmentation fault (reviewer t25). Now each fails with the call's code for memory that is
    no allocation (107000), which the synchronize reports; the stream works on."""
    out, stderr = run_script(_QUEUED_COPY_AND_MEMSET)
    assert out == {"held": 0, "copy": 0, "memset": 0, "frees": [0, 0, 0], "sync": C.ACL_ERROR_RT_PARAM_INVALID,
                   "next": [0, 0]}, stderr[-3000:]
    assert "memcpy of 1048576 bytes" in stderr and "freed before the copy ran" in stderr, stderr[-3000:]
    assert "memset of 1048576 bytes" in stderr and "freed before the memset ran" in stderr, stderr[-3000:]


_RUNNING_COPY = _PRELUDE + """
source = device()
host, _ = acl.rt.malloc_host(BIG)
gate, held = holding("memcpy")
out = {"copy": acl.rt.memcpy_async(host, BIG, source, BIG, D2H, stream)}
assert held.entered.wait(30)  # the copy is under way (its memory taken)
free_before = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0]
maps = [mapping(source), mapping(host)]
out["frees"] = [acl.rt.free(source), acl.rt.free_host(host)]
out["freed_bytes"] = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0] - free_before  # counted free at once
out["unmapped_while_running"] = [m.closed for m in maps]
gate.set()
out["sync"] = acl.rt.synchronize_stream(stream)
out["unmapped_when_done"] = [m.closed for m in maps]
print(json.dumps(out))
"""


def test_memory_freed_while_its_copy_runs_stays_mapped_until_the_copy_is_done():
    out, stderr = run_script(_RUNNING_COPY)
    assert out["frees"] == [0, 0] and out["sync"] == 0 and out["freed_bytes"] >= 1 << 20, (out, stderr[-3000:])
    assert out["unmapped_while_running"] == [False, False] and out["unmapped_when_done"] == [True, True], out


_DVPP = _PRELUDE + """
import logging
from tests.images.images_data import encode, gradient

logging.basicConfig(level=logging.INFO)  # (a task's failure is an INFO line: the caller's error says it)

media = acl.media
channel = media.dvpp_create_channel_desc()
assert media.dvpp_create_channel(channel) == 0


def dvpp(size=BIG, data=b""):
    ptr, ret = media.dvpp_malloc(size)
    assert ret == 0
    acl.rt.memcpy(ptr, size, acl.util.bytes_to_ptr(data), len(data), C.ACL_MEMCPY_HOST_TO_DEVICE) if data else None
    return ptr


def pic(ptr, w, h, ws, hs, size=BIG):
    desc = media.dvpp_create_pic_desc()
    for name, value in (("data", ptr), ("size", size), ("format", 1), ("width", w), ("height", h),
                        ("width_stride", ws), ("height_stride", hs)):
        assert getattr(media, f"dvpp_set_pic_desc_{name}")(desc, value) == 0
    return desc


jpeg = encode(gradient(240, 320), "JPEG")
first, queued, running = dvpp(data=jpeg), dvpp(data=jpeg), dvpp(data=jpeg)
outs = [pic(dvpp(), 0, 0, 0, 0) for _ in range(3)]
nv12 = pic(dvpp(), 320, 240, 384, 240)
assert media.dvpp_jpeg_decode_async(channel, first, len(jpeg), nv12, stream) == 0
assert acl.rt.synchronize_stream(stream) == 0
config = media.dvpp_create_resize_config()
out = {}
gate, held = holding("dvpp")
out["held"] = media.dvpp_jpeg_decode_async(channel, first, len(jpeg), outs[0], stream)
assert held.entered.wait(30)
out["decode"] = media.dvpp_jpeg_decode_async(channel, queued, len(jpeg), outs[1], stream)
out["resize"] = media.dvpp_vpc_resize_async(channel, nv12, pic(dvpp(), 160, 120, 160, 120), config, stream)
out["frees"] = [media.dvpp_free(queued), media.dvpp_free(media.dvpp_get_pic_desc_data(nv12))]
gate.set()
out["sync"] = acl.rt.synchronize_stream(stream)
out["ret_code"] = media.dvpp_get_pic_desc_ret_code(outs[1])
gate, held = holding("dvpp")
out["running"] = media.dvpp_jpeg_decode_async(channel, running, len(jpeg), outs[2], stream)
assert held.entered.wait(30)
maps = [mapping(running), mapping(media.dvpp_get_pic_desc_data(outs[2]))]
out["running_frees"] = [media.dvpp_free(running), media.dvpp_free(media.dvpp_get_pic_desc_data(outs[2]))]
gate.set()
out["running_sync"] = acl.rt.synchronize_stream(stream)
out["unmapped_when_done"] = [m.closed for m in maps]
print(json.dumps(out))
"""


def test_a_dvpp_task_never_reads_or_writes_freed_dvpp_memory():
    """JPEGD read its input (ctypes.string_at) and VPC both pictures when the task ran, unchecked:
    freed since the call, that ended the process. Now a task queued finds them gone (the task
    fails: the stream's 507000 and JPEGD's ret_code 1, as for the other failures found when it
    runs), and one running keeps them mapped until it is done."""
    out, stderr = run_script(_DVPP)
    assert out == {"held": 0, "decode": 0, "resize": 0, "frees": [0, 0], "sync": C.ACL_ERROR_RT_INTERNAL_ERROR,
                   "ret_code": 1, "running": 0, "running_frees": [0, 0], "running_sync": 0,
                   "unmapped_when_done": [True, True]}, stderr[-3000:]
    assert "JPEGD task failed: its input or output is no longer DVPP memory" in stderr, stderr[-3000:]
    assert "VPC task failed: its input or output is no longer DVPP memory" in stderr, stderr[-3000:]


_MODEL = _PRELUDE + """
def datasets(model_id):
    '''(input dataset set to gear 8, output dataset, the outputs' memory) of a loaded model.'''
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0

    def dataset(count, size_of):
        ds, ptrs = acl.mdl.create_dataset(), []
        for i in range(count):
            ptrs.append(device())
            assert acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptrs[-1], size_of(desc, i)))[1] == 0
        return ds, ptrs

    (ins, _), (outs, out_ptrs) = (dataset(acl.mdl.get_num_inputs(desc), acl.mdl.get_input_size_by_index),
                                  dataset(acl.mdl.get_num_outputs(desc), acl.mdl.get_output_size_by_index))
    mbatch, _ = acl.mdl.get_input_index_by_name(desc, C.ACL_DYNAMIC_TENSOR_NAME)
    assert acl.mdl.set_dynamic_batch_size(model_id, ins, mbatch, 8) == 0
    return ins, outs, out_ptrs
"""

_RUNNING_EXECUTION = _MODEL + """
model_id, ret = acl.mdl.load_from_file(sys.argv[1])
assert ret == 0
ins, outs, out_ptrs = datasets(model_id)
gate, held = holding("execute")
out = {"execute": acl.mdl.execute_async(model_id, ins, outs, stream)}
assert held.entered.wait(30)  # running, its buffers taken
maps = [mapping(ptr) for ptr in out_ptrs]
out["frees"] = [acl.rt.free(ptr) for ptr in out_ptrs]
gate.set()
out["sync"] = acl.rt.synchronize_stream(stream)
out["unmapped_when_done"] = [m.closed for m in maps]
out["again"] = [acl.mdl.execute_async(model_id, ins, outs, stream), acl.rt.synchronize_stream(stream)]
print(json.dumps(out))
"""


def test_outputs_freed_while_an_execution_runs_stay_mapped_until_it_is_done(affine_om):
    """The execution checked its buffers as it started, then ONNX Runtime wrote the outputs: freed
    meanwhile, they were unmapped under it and the process ended. The next execution, queued
    after the free, is refused (145000, as before)."""
    out, stderr = run_script(_RUNNING_EXECUTION, affine_om())
    assert out == {"execute": 0, "frees": [0, 0], "sync": 0, "unmapped_when_done": [True, True],
                   "again": [0, C.ACL_ERROR_GE_PARAM_INVALID]}, stderr[-3000:]


_MODEL_MEMORY_FREED = _MODEL + """
work, weight, _ = acl.mdl.query_size(sys.argv[1])
work_ptr, weight_ptr = device(max(work, BIG)), device(max(weight, BIG))
model_id, ret = acl.mdl.load_from_file_with_mem(sys.argv[1], work_ptr, work, weight_ptr, weight)
assert ret == 0
ins, outs, _ = datasets(model_id)
out = {"before": acl.mdl.execute(model_id, ins, outs)}
free_before = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0]
maps = [mapping(weight_ptr), mapping(work_ptr)]
out["frees"] = [acl.rt.free(weight_ptr), acl.rt.free(work_ptr)]
out["freed_bytes"] = acl.rt.get_mem_info(C.ACL_HBM_MEM)[0] - free_before
out["execute"] = acl.mdl.execute(model_id, ins, outs)
out["async"] = [acl.mdl.execute_async(model_id, ins, outs, stream), acl.rt.synchronize_stream(stream)]
out["unmapped_while_loaded"] = [m.closed for m in maps]
out["unload"] = acl.mdl.unload(model_id)
out["unmapped_when_unloaded"] = [m.closed for m in maps]
print(json.dumps(out))
"""


def test_a_model_whose_memory_was_freed_while_loaded_fails_its_executions(affine_om):
    """pyACL: memory given to load_from_file_with_mem is kept until after unload. Freed before,
    the CPU runtime ran on as if nothing happened (reviewer t25, t3.py; ONNX Runtime has copies
    of the weights, but is given views of the weight memory). As on a device, whose driver does
    not know GE uses it, the free succeeds and the bytes count free; the memory stays mapped
    until unload, and each execution fails with 507011, a model failing on the device, where a
    device would run on freed memory."""
    out, stderr = run_script(_MODEL_MEMORY_FREED, affine_om())
    assert out.pop("freed_bytes") >= 2 << 20, (out, stderr[-3000:])
    failed = C.ACL_ERROR_RT_MODEL_EXECUTE
    assert out == {"before": 0, "frees": [0, 0], "execute": failed, "async": [0, failed],
                   "unmapped_while_loaded": [False, False], "unload": 0,
                   "unmapped_when_unloaded": [True, True]}, stderr[-3000:]
    assert "its work or weight memory was freed while it is loaded" in stderr, stderr[-3000:]
