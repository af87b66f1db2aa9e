"""aclmdlDesc: a model's description, filled by get_desc from a loaded model.

A desc keeps a reference to the model's ModelInfo, so it stays readable after unload, as a C
desc would; but for get_cur_output_dims, which asks the loaded model for the gear last set by
set_dynamic_batch_size and is refused once it is unloaded. Value-returning calls give
0 / -1 / "" on error.
"""
from __future__ import annotations

import threading

from .. import constants as C
from . import _state, _tensor_names
from ._model import models


class Desc:
    __slots__ = ("handle", "model")

    def __init__(self):
        self.handle = _state.new_handle()
        self.model = None


_lock = threading.Lock()
descs: dict[int, Desc] = {}


def create() -> int:
    desc = Desc()
    with _lock:
        descs[desc.handle] = desc
    return desc.handle


def fill(handle: int, model_id: int) -> int:
    desc = descs.get(handle)
    if desc is None:
        return C.ACL_ERROR_INVALID_PARAM
    model = models.get(model_id)
    if model is None:
        return C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    desc.model = model
    return C.ACL_SUCCESS


def destroy(handle: int) -> int:
    with _lock:
        return C.ACL_SUCCESS if descs.pop(handle, None) is not None else C.ACL_ERROR_INVALID_PARAM


def info(handle: int):
    desc = descs.get(handle)
    return desc.model.info if desc is not None and desc.model is not None else None


def tensor(handle: int, index: int, outputs: bool):
    i = info(handle)
    if i is None:
        return None
    tensors = i.outputs if outputs else i.inputs
    return tensors[index] if 0 <= index < len(tensors) else None


def dims(handle: int, index: int, outputs: bool, current: bool = False, v2: bool = False) -> tuple[dict, int]:
    t = tensor(handle, index, outputs)
    if t is None:
        return {}, C.ACL_ERROR_INVALID_PARAM
    model = descs[handle].model
    if current and models.get(model.id) is not model:
        # aclmdlGetCurOutputDims asks GE for the model's current shape (GeExecutor::GetCurShape),
        # whatever the output: an unloaded model id is "Invalid Model ID" there (hicann/ge
        # ModelManager::GetCurrentShape), as for every call naming one
        return {}, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    values = list(t.dims_v2 if v2 else t.dims)  # (v2: an AIPP input's buffer, whose product is its size)
    if outputs and -1 in values:
        # An output is reported at a gear, never with -1 (an input is: [-1, 3, 224, 224]). CANN's
        # aclmdlGetOutputDims page: with dynamic batch, the largest gear's dims; its
        # aclmdlGetCurOutputDims page: the gear set_dynamic_batch_size set (GE keeps it per
        # model), the largest before any
        batch = model.set_batch if current and model.set_batch is not None else model.info.max_batch
        values = list(t.shape_at(batch))
    name = _tensor_names.dims_name(model.info, model.id, index, outputs)  # (a stand-in past 127 bytes)
    return {"name": name, "dimCount": len(values), "dims": values}, C.ACL_SUCCESS


def real_name(handle: int, name: str) -> str | None:
    desc = descs.get(handle)
    if desc is None or desc.model is None:
        return None
    return _tensor_names.real_name(desc.model.info, desc.model.id, name)


def size(handle: int, index: int, outputs: bool) -> int:
    t = tensor(handle, index, outputs)
    return t.size if t is not None else 0


def index_by_name(handle: int, name: str, outputs: bool) -> tuple[int, int]:
    i = info(handle)
    if i is None:
        return 0, C.ACL_ERROR_INVALID_PARAM
    for n, t in enumerate(i.outputs if outputs else i.inputs):
        if t.name == name:
            return n, C.ACL_SUCCESS
    return 0, C.ACL_ERROR_INVALID_PARAM


def dynamic_batch(handle: int) -> tuple[dict, int]:
    i = info(handle)
    if i is None:
        return {}, C.ACL_ERROR_INVALID_PARAM
    return {"batchCount": len(i.gears), "batch": list(i.gears)}, C.ACL_SUCCESS
