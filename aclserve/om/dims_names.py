"""The name get_*_dims give a tensor: its own, or past 127 bytes a stand-in.

aclmdlIODims.name is char[ACL_MAX_TENSOR_NAME_LEN = 128]: GE reports a tensor whose name (UTF-8,
as pyACL passes it) takes more bytes than fit beside its NUL as acl_modelId_<model id>_<input|
output>_<index> (hicann/ge model.cpp GetTensorDescNameToDims, GetConvertTensorName), where
get_*_name_by_index report the name itself. Imports nothing heavy: `aclserve inspect` and the CPU
runtime (acl/cpu/_tensor_names.py) both use it.
"""
from __future__ import annotations

DIMS_NAME_BYTES = 127


def fits_dims(name: str) -> bool:
    return len(name.encode("utf-8", "surrogatepass")) <= DIMS_NAME_BYTES


def dims_stand_in(model_id: int | str, outputs: bool, index: int) -> str:
    return f"acl_modelId_{model_id}_{'output' if outputs else 'input'}_{index}"
