"""acl.mdl for the CPU runtime: load CPU OMs, describe them, run them with ONNX Runtime.

Same names, argument order and returns as pyACL. Loads and executions need a current context,
and a model is executed and unloaded under the context it was loaded in (107004 otherwise);
descriptor, dataset and buffer calls are host-side bookkeeping and do not.
"""
from __future__ import annotations

import logging

from .. import constants as C
from . import _dataset, _desc, _err_msg, _model, _om, _state, faults
from ._args import INT, PTR, STR, api

log = logging.getLogger("aclserve.acl.cpu")

_OK = C.ACL_SUCCESS


# -- loading -------------------------------------------------------------------------------------
@api("acl.mdl.query_size", STR)
def query_size(model_path):
    ret = _state.check_init()
    if ret:
        return 0, 0, ret
    code = faults.trigger("query_size", 0)
    if code:
        return 0, 0, code
    info, payload, ret = _om.read_file(model_path)
    if ret:
        return 0, 0, ret
    with payload:
        try:  # a corrupt payload is refused here too (read in chunks, not held)
            payload.verify()
        except (OSError, ValueError) as e:
            _om.log.info("%s is not a loadable CPU OM: %s", model_path, e)
            return 0, 0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    work, weight = _om.query_size(info)
    return work, weight, _OK


def _load_file(path: str, mem=None):
    ctx, ret = _state.current()
    if ret:
        return 0, ret
    info, payload, ret = _om.read_file(path)
    if ret:
        return 0, ret
    with payload:
        return _model.load(ctx, info, payload, mem)


def _load_mem(ptr: int, size: int, mem=None):
    ctx, ret = _state.current()
    if ret:
        return 0, ret
    if ptr == 0 or size <= 0:
        return 0, C.ACL_ERROR_INVALID_PARAM
    try:  # through /proc/self/mem: a bad address gives an error instead of a crash
        with open("/proc/self/mem", "rb", buffering=0) as mem_file:
            mem_file.seek(ptr)
            data = mem_file.read(size)
    except (OSError, OverflowError, ValueError):
        data = b""
    if len(data) != size:
        return 0, C.ACL_ERROR_INVALID_PARAM
    info, payload, ret = _om.parse(data, f"model at {ptr:#x}")
    return (0, ret) if ret else _model.load(ctx, info, payload, mem)


@api("acl.mdl.load_from_file", STR)
def load_from_file(model_path):
    return _load_file(model_path)


@api("acl.mdl.load_from_mem", PTR, PTR)
def load_from_mem(model, model_size):
    return _load_mem(model, model_size)


@api("acl.mdl.load_from_file_with_mem", STR, PTR, PTR, PTR, PTR)
def load_from_file_with_mem(model_path, work_ptr, work_size, weight_ptr, weight_size):
    return _load_file(model_path, (work_ptr, work_size, weight_ptr, weight_size))


@api("acl.mdl.load_from_mem_with_mem", PTR, PTR, PTR, PTR, PTR, PTR)
def load_from_mem_with_mem(model, model_size, work_ptr, work_size, weight_ptr, weight_size):
    return _load_mem(model, model_size, (work_ptr, work_size, weight_ptr, weight_size))


@api("acl.mdl.unload", INT)
def unload(model_id):
    ctx, ret = _state.current()
    return ret or _model.unload(ctx, model_id)


# -- description ---------------------------------------------------------------------------------
@api("acl.mdl.create_desc")
def create_desc():
    return _desc.create()


@api("acl.mdl.get_desc", PTR, INT)
def get_desc(model_desc, model_id):
    model = _model.models.get(model_id)  # (its name, for a fault scoped by model=)
    code = faults.trigger("describe", model_id, name=model.info.name if model else "")
    return code or _desc.fill(model_desc, model_id)


@api("acl.mdl.destroy_desc", PTR)
def destroy_desc(model_desc):
    return _desc.destroy(model_desc)


@api("acl.mdl.get_num_inputs", PTR)
def get_num_inputs(model_desc):
    info = _desc.info(model_desc)
    return len(info.inputs) if info else 0


@api("acl.mdl.get_num_outputs", PTR)
def get_num_outputs(model_desc):
    info = _desc.info(model_desc)
    return len(info.outputs) if info else 0


@api("acl.mdl.get_input_size_by_index", PTR, PTR)
def get_input_size_by_index(model_desc, index):
    return _desc.size(model_desc, index, outputs=False)


@api("acl.mdl.get_output_size_by_index", PTR, PTR)
def get_output_size_by_index(model_desc, index):
    return _desc.size(model_desc, index, outputs=True)


@api("acl.mdl.get_input_dims", PTR, PTR)
def get_input_dims(model_desc, index):
    return _desc.dims(model_desc, index, outputs=False)


@api("acl.mdl.get_input_dims_v2", PTR, PTR)
def get_input_dims_v2(model_desc, index):
    return _desc.dims(model_desc, index, outputs=False, v2=True)


@api("acl.mdl.get_output_dims", PTR, PTR)
def get_output_dims(model_desc, index):
    return _desc.dims(model_desc, index, outputs=True)


@api("acl.mdl.get_cur_output_dims", PTR, PTR)
def get_cur_output_dims(model_desc, index):
    return _desc.dims(model_desc, index, outputs=True, current=True)


@api("acl.mdl.get_input_data_type", PTR, PTR)
def get_input_data_type(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=False)
    return t.acl_dtype if t else C.ACL_DT_UNDEFINED


@api("acl.mdl.get_output_data_type", PTR, PTR)
def get_output_data_type(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=True)
    return t.acl_dtype if t else C.ACL_DT_UNDEFINED


@api("acl.mdl.get_input_format", PTR, PTR)
def get_input_format(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=False)
    return t.format if t else C.ACL_FORMAT_UNDEFINED


@api("acl.mdl.get_output_format", PTR, PTR)
def get_output_format(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=True)
    return t.format if t else C.ACL_FORMAT_UNDEFINED


@api("acl.mdl.get_input_name_by_index", PTR, PTR)
def get_input_name_by_index(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=False)
    return t.name if t else ""


@api("acl.mdl.get_output_name_by_index", PTR, PTR)
def get_output_name_by_index(model_desc, index):
    t = _desc.tensor(model_desc, index, outputs=True)
    return t.name if t else ""


@api("acl.mdl.get_input_index_by_name", PTR, STR)
def get_input_index_by_name(model_desc, name):
    return _desc.index_by_name(model_desc, name, outputs=False)


@api("acl.mdl.get_output_index_by_name", PTR, STR)
def get_output_index_by_name(model_desc, name):
    return _desc.index_by_name(model_desc, name, outputs=True)


@api("acl.mdl.get_tensor_real_name", PTR, STR)
def get_tensor_real_name(model_desc, name):
    """The name a get_*_dims stand-in (or the name itself) stands for; None if none (_tensor_names.py)."""
    return _desc.real_name(model_desc, name)


@api("acl.mdl.get_dynamic_batch", PTR)
def get_dynamic_batch(model_desc):
    return _desc.dynamic_batch(model_desc)


@api("acl.mdl.get_first_aipp_info", INT, PTR)
def get_first_aipp_info(model_id, index):
    ret = _state.check_init()
    if ret:
        return None, ret
    model = _model.models.get(model_id)
    if model is None:
        return None, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    info = model.info.aipp.get(index)
    if info is None:
        return None, C.ACL_ERROR_GE_AIPP_NOT_EXIST
    return dict(info), _OK  # a copy: the caller may change it


# -- datasets ------------------------------------------------------------------------------------
@api("acl.mdl.create_dataset")
def create_dataset():
    return _dataset.create_dataset()


@api("acl.mdl.add_dataset_buffer", PTR, PTR)
def add_dataset_buffer(dataset, data_buffer):
    return _dataset.add_dataset_buffer(dataset, data_buffer)


@api("acl.mdl.get_dataset_num_buffers", PTR)
def get_dataset_num_buffers(dataset):
    return _dataset.num_buffers(dataset)


@api("acl.mdl.get_dataset_buffer", PTR, PTR)
def get_dataset_buffer(dataset, index):
    return _dataset.get_buffer(dataset, index)


@api("acl.mdl.destroy_dataset", PTR)
def destroy_dataset(dataset):
    return _dataset.destroy_dataset(dataset)


# -- execution -----------------------------------------------------------------------------------
def _resolve(model_id: int, input_ds: int, output_ds: int):
    """(context, model, the execution's (input blobs, output blobs, gear), ret). The datasets'
    buffers and gear are taken now, as ModelExecute copies them at the call (hicann/ge model.cpp:
    the blobs and dynamicBatchSize into GE's InputData/OutputData): an update_data_buffer or set
    after the call is not a queued execution's."""
    ctx, ret = _state.current()
    if ret:
        return None, None, None, ret
    model = _model.models.get(model_id)
    if model is None:
        return None, None, None, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    if model.context is not ctx:
        return None, None, None, C.ACL_ERROR_RT_MODEL_CONTEXT
    ins, outs = _dataset.datasets.get(input_ds), _dataset.datasets.get(output_ds)
    if ins is None or outs is None:
        return None, None, None, C.ACL_ERROR_INVALID_PARAM
    call = (ins.blobs(), outs.blobs(), ins.gear)
    if call[0] is None or call[1] is None:
        which, ds = ("input", ins) if call[0] is None else ("output", outs)
        return None, None, None, _holds_destroyed(model_id, which, ds.destroyed_index())
    return ctx, model, call, model.validate(*call)


def _holds_destroyed(model_id: int, which: str, index: int) -> int:
    """A dataset holding a buffer destroyed since it was added: refused as a destroyed handle is
    (on a device, ModelExecute would read the freed aclDataBuffer)."""
    text = (f"model {model_id}: buffer {index} of the {which} dataset was destroyed "
            f"(destroy_data_buffer) while the dataset holds it")
    log.error("%s", text)
    _err_msg.report(text)
    return C.ACL_ERROR_INVALID_PARAM


@api("acl.mdl.set_dynamic_batch_size", INT, PTR, PTR, PTR)
def set_dynamic_batch_size(model_id, dataset, index, batch_size):
    ctx, ret = _state.current()
    if ret:
        return ret
    ds = _dataset.datasets.get(dataset)
    if ds is None:
        return C.ACL_ERROR_INVALID_PARAM
    if 0 <= index < len(ds.buffers) and ds.buffers[index].destroyed:
        return _holds_destroyed(model_id, "input", index)
    return _model.set_dynamic_batch_size(model_id, ds, index, batch_size)


@api("acl.mdl.execute", INT, PTR, PTR)
def execute(model_id, input, output):  # noqa: A002  (pyACL's parameter names)
    """Run now. CANN runs it on a stream of the context's own: a context stopped on a failure
    (or on a device that failed as a whole) takes it no more, and in stop-on-failure mode its
    failure stops the context."""
    ctx, model, call, ret = _resolve(model_id, input, output)
    if ret:
        return ret
    if ctx.refusal():
        return ctx.refusal()
    before = _err_msg.reported()
    ret = model.run(*call)
    if ret:  # (this thread has the run's message, if it said one; a later synchronize's gets it too)
        ctx.task_failed(ret, _err_msg.said_since(before))
    return ret


@api("acl.mdl.execute_async", INT, PTR, PTR, PTR)
def execute_async(model_id, input, output, stream):  # noqa: A002
    ctx, model, call, ret = _resolve(model_id, input, output)
    if ret:
        return ret
    s, ret = _state.stream_of(stream, ctx)
    if ret:
        return ret
    ret = faults.trigger("execute_call", model_id, name=model.info.name)  # the call itself failing or blocking
    if ret:
        return ret
    return s.enqueue(lambda: model.run(*call))
