"""A tensor's name as get_*_dims report it, and acl.mdl.get_tensor_real_name mapping it back.

aclmdlIODims.name holds 127 bytes: GE reports a longer name under the stand-in
acl_modelId_<model id>_<input|output>_<index>, "_a" to "_zzz" appended where a tensor of the
model is really named so (hicann/ge model.cpp GetTensorDescNameToDims, TransConvertTensorNameToLegal).
get_*_name_by_index and get_*_index_by_name know the real name only. get_tensor_real_name gives a
tensor's name for that name itself, or for any name of the stand-in's form (a sixth "_" part
unchecked) that holds the desc's model id and an index in range; None for anything else, as
pyACL's Py_BuildValue("s") makes of the NULL (hicann/ge aclmdlGetTensorRealName:
GetRealTensorName, then TransTensorNameToReal).
"""
from __future__ import annotations

import itertools
import string

from ...om.dims_names import dims_stand_in, fits_dims

_SUFFIX_LETTERS = 3  # GE's search for a free stand-in ends there, reporting the clashing one
_ULONG_MAX = (1 << 64) - 1


def dims_name(info, model_id: int, index: int, outputs: bool) -> str:
    name = (info.outputs if outputs else info.inputs)[index].name
    if fits_dims(name):
        return name
    stand_in = dims_stand_in(model_id, outputs, index)
    taken = {t.name for t in info.inputs + info.outputs}
    if stand_in not in taken:
        return stand_in
    for length in range(1, _SUFFIX_LETTERS + 1):  # (breadth first: _a.._z, then _aa.._zz, ...)
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            if f"{stand_in}_{''.join(letters)}" not in taken:
                return f"{stand_in}_{''.join(letters)}"
    return stand_in


def real_name(info, model_id: int, name: str) -> str | None:
    for t in info.inputs + info.outputs:
        if t.name == name:
            return t.name
    parts = name.split("_")  # (as GE's Split: empty parts kept, one after a trailing "_")
    if len(parts) not in (5, 6) or parts[0] != "acl" or parts[1] != "modelId" or _strtoul(parts[2]) != model_id:
        return None
    index = _strtoul(parts[4])
    tensors = {"input": info.inputs, "output": info.outputs}.get(parts[3])
    if index is None or tensors is None or index >= len(tensors):
        return None
    return tensors[index].name


def _strtoul(text: str) -> int | None:
    """A string of ASCII digits as strtoul reads it (saturating at ULONG_MAX); None for any other."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else _ULONG_MAX  # (int() refuses over 4,300 digits)
